//! Columns inside columns: a view may name a struct's field by its path
//! (`user.age`), the field of a list of structs (`tags.id`, `tags.weight`:
//! an id-score list), or a map's keys and values (`features.key`,
//! `features.value`). A path through a list is itself a list, of the
//! field's values, with the list's row offsets: the tensors of one list's
//! fields share their offsets. A name the file has as a column is that
//! column, dots and all; at most one list on a path.

use arrow::array::{Array, ArrayRef, AsArray, GenericListArray, OffsetSizeTrait, RecordBatch, StructArray};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{DataType, Field, FieldRef, Schema};
use std::sync::Arc;

/// The root column a view's column `path` is read from (its index in
/// `schema`), and the Arrow type of what the path names; `None` when the
/// schema has no such column or field.
pub fn find(schema: &Schema, path: &str) -> Option<(usize, DataType)> {
    if let Some((i, f)) = schema.column_with_name(path) {
        return Some((i, f.data_type().clone()));
    }
    let (root, rest) = path.split_once('.')?;
    let (i, f) = schema.column_with_name(root)?;
    Some((i, type_at(f.data_type(), rest, false)?))
}

/// Whether `path` names a field inside a column rather than a column.
pub fn is_nested(schema: &Schema, path: &str) -> bool {
    schema.column_with_name(path).is_none() && find(schema, path).is_some()
}

/// The type `rest` names inside a value of type `dt` (`in_list`: a list
/// was passed on the way, so a second one is refused).
fn type_at(dt: &DataType, rest: &str, in_list: bool) -> Option<DataType> {
    let (name, tail) = match rest.split_once('.') {
        Some((n, t)) => (n, Some(t)),
        None => (rest, None),
    };
    let inner = |child: &DataType, in_list| match tail {
        None => Some(child.clone()),
        Some(t) => type_at(child, t, in_list),
    };
    match dt {
        DataType::Struct(fields) => inner(fields.iter().find(|f| f.name() == name)?.data_type(), in_list),
        DataType::List(item) | DataType::LargeList(item) | DataType::Map(item, _) if !in_list => {
            let DataType::Struct(fields) = item.data_type() else { return None };
            let child = inner(fields.iter().find(|f| f.name() == name)?.data_type(), true)?;
            let field: FieldRef = Arc::new(Field::new_list_field(child, true));
            Some(match dt {
                DataType::LargeList(_) => DataType::LargeList(field),
                _ => DataType::List(field),
            })
        }
        _ => None,
    }
}

/// The array `path` names in `batch` (whose root columns were read), built
/// from it: a struct's field with the struct's nulls, a list's field as a
/// list with the list's offsets and nulls. `None` when there is no such
/// column or field.
pub fn array(batch: &RecordBatch, path: &str) -> Option<ArrayRef> {
    if let Some(a) = batch.column_by_name(path) {
        return Some(a.clone());
    }
    let (root, rest) = path.split_once('.')?;
    array_at(batch.column_by_name(root)?, rest)
}

fn array_at(a: &ArrayRef, rest: &str) -> Option<ArrayRef> {
    let (name, tail) = match rest.split_once('.') {
        Some((n, t)) => (n, Some(t)),
        None => (rest, None),
    };
    let inner = |child: ArrayRef| match tail {
        None => Some(child),
        Some(t) => array_at(&child, t),
    };
    match a.data_type() {
        DataType::Struct(_) => inner(field_of(a.as_struct(), name)?),
        DataType::List(_) => list_field(a.as_list::<i32>(), name, tail),
        DataType::LargeList(_) => list_field(a.as_list::<i64>(), name, tail),
        DataType::Map(_, _) => {
            let m = a.as_map();
            listed::<i32>(m.entries(), m.offsets(), m.nulls(), name, tail)
        }
        _ => None,
    }
}

/// Field `name` (then `tail` inside it) of the struct `values` of a list
/// with `offsets` and `nulls`, as a list with the same offsets and nulls.
fn listed<O: OffsetSizeTrait>(
    values: &StructArray,
    offsets: &arrow::buffer::OffsetBuffer<O>,
    nulls: Option<&NullBuffer>,
    name: &str,
    tail: Option<&str>,
) -> Option<ArrayRef> {
    let child = field_of(values, name)?;
    let child = match tail {
        None => child,
        Some(t) => array_at(&child, t)?,
    };
    let field: FieldRef = Arc::new(Field::new_list_field(child.data_type().clone(), true));
    Some(Arc::new(GenericListArray::<O>::try_new(field, offsets.clone(), child, nulls.cloned()).ok()?))
}

/// Field `name` of `s`, null wherever `s` is.
fn field_of(s: &StructArray, name: &str) -> Option<ArrayRef> {
    let child = s.column_by_name(name)?.clone();
    if s.null_count() == 0 {
        return Some(child);
    }
    let nulls = NullBuffer::union(s.nulls(), child.nulls());
    let data = child.to_data().into_builder().nulls(nulls).build().ok()?;
    Some(arrow::array::make_array(data))
}

/// The list of field `name` of `list`'s struct values, with its offsets
/// and nulls.
fn list_field<O: OffsetSizeTrait>(list: &GenericListArray<O>, name: &str, tail: Option<&str>) -> Option<ArrayRef> {
    listed(list.values().as_struct_opt()?, list.offsets(), list.nulls(), name, tail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float32Array, Int64Array, Int64Builder, ListArray, MapBuilder, StringBuilder};
    use arrow::buffer::OffsetBuffer;
    use arrow::datatypes::Fields;

    fn batch() -> RecordBatch {
        // user: Struct<age: i64>, its second row null.
        let age: ArrayRef = Arc::new(Int64Array::from(vec![30, 99, 41]));
        let user_fields = Fields::from(vec![Field::new("age", DataType::Int64, false)]);
        let user = StructArray::new(user_fields, vec![age], Some(NullBuffer::from(vec![true, false, true])));
        // tags: List<Struct<id: i64, weight: f32>>: [(1, .5), (2, .25)], [], [(3, 1)].
        let tag_fields = Fields::from(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("weight", DataType::Float32, false),
        ]);
        let entries = StructArray::new(
            tag_fields.clone(),
            vec![Arc::new(Int64Array::from(vec![1, 2, 3])), Arc::new(Float32Array::from(vec![0.5, 0.25, 1.0]))],
            None,
        );
        let item = Arc::new(Field::new("item", DataType::Struct(tag_fields), true));
        let tags = ListArray::new(item, OffsetBuffer::from_lengths([2, 0, 1]), Arc::new(entries), None);
        // features: Map<Utf8, i64>: {a: 1}, {}, {b: 2, c: 3}.
        let mut m = MapBuilder::new(None, StringBuilder::new(), Int64Builder::new());
        m.keys().append_value("a");
        m.values().append_value(1);
        m.append(true).unwrap();
        m.append(true).unwrap();
        for (k, v) in [("b", 2), ("c", 3)] {
            m.keys().append_value(k);
            m.values().append_value(v);
        }
        m.append(true).unwrap();
        let features = m.finish();
        let schema = Schema::new(vec![
            Field::new("user", user.data_type().clone(), true),
            Field::new("tags", tags.data_type().clone(), true),
            Field::new("features", features.data_type().clone(), true),
        ]);
        RecordBatch::try_new(Arc::new(schema), vec![Arc::new(user), Arc::new(tags), Arc::new(features)]).unwrap()
    }

    #[test]
    fn a_struct_field_keeps_the_struct_s_nulls() {
        let b = batch();
        assert_eq!(find(&b.schema(), "user.age"), Some((0, DataType::Int64)));
        let age = array(&b, "user.age").unwrap();
        let age = age.as_primitive::<arrow::datatypes::Int64Type>();
        assert_eq!((age.value(0), age.is_null(1), age.value(2)), (30, true, 41));
        assert!(is_nested(&b.schema(), "user.age") && !is_nested(&b.schema(), "user"));
        assert_eq!(find(&b.schema(), "user.height"), None);
        assert_eq!(find(&b.schema(), "nobody.age"), None);
    }

    #[test]
    fn the_fields_of_a_list_of_structs_share_its_offsets() {
        let b = batch();
        let (i, dt) = find(&b.schema(), "tags.weight").unwrap();
        assert_eq!(i, 1);
        assert!(matches!(&dt, DataType::List(f) if f.data_type() == &DataType::Float32), "{dt}");
        let ids = array(&b, "tags.id").unwrap();
        let weights = array(&b, "tags.weight").unwrap();
        let (ids, weights) = (ids.as_list::<i32>(), weights.as_list::<i32>());
        assert_eq!(ids.offsets(), weights.offsets());
        assert_eq!(ids.value_offsets(), &[0, 2, 2, 3]);
        assert_eq!(ids.values().as_primitive::<arrow::datatypes::Int64Type>().values(), &[1, 2, 3]);
    }

    #[test]
    fn a_map_is_its_keys_and_its_values_with_one_offsets() {
        let b = batch();
        assert!(
            matches!(find(&b.schema(), "features.key"), Some((2, DataType::List(f))) if f.data_type() == &DataType::Utf8)
        );
        let keys = array(&b, "features.key").unwrap();
        let values = array(&b, "features.value").unwrap();
        assert_eq!(keys.as_list::<i32>().value_offsets(), &[0, 1, 1, 3]);
        assert_eq!(values.as_list::<i32>().values().as_primitive::<arrow::datatypes::Int64Type>().values(), &[1, 2, 3]);
        assert_eq!(find(&b.schema(), "features.nope"), None);
    }
}
