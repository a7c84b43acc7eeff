//! A view checked against one file's Arrow schema: [`resolve_view`] names
//! the file, tensor and column that do not fit, and works out every
//! tensor's shape and the columns to read. The node's converter builds
//! chunks from the [`Resolved`] view; the coordinator uses the same check
//! when a dataset is registered, so a view that does not fit is refused
//! before any node converts a shard of it.

use crate::error::SchemaError;
use arrow::datatypes::{DataType, SchemaRef};
use granary_proto::{DType, TensorLayout, View};

/// How a tensor is built.
#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    /// One scalar column.
    Scalar,
    /// Several scalar columns of one type.
    Stacked,
    /// One `FixedSizeList<T, k>` column.
    List(usize),
}

/// One tensor of a view, resolved against a schema.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedTensor {
    /// The tensor's name.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// How it is built from its columns.
    pub kind: Kind,
    /// The columns, in view order.
    pub columns: Vec<String>,
    /// The value that replaces a null, if the view declares one.
    pub fill: Option<f64>,
}

/// A view resolved against one file's schema.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved {
    /// Tensor layouts, in view order.
    pub layouts: Vec<TensorLayout>,
    /// Root column indices to read (the projection).
    pub projection: Vec<usize>,
    /// How each tensor is built, in view order.
    pub tensors: Vec<ResolvedTensor>,
}

/// The Arrow type a dtype is stored as without a cast (`None` for bf16,
/// which Arrow has no type for).
pub fn arrow_type(dtype: DType) -> Option<DataType> {
    Some(match dtype {
        DType::F32 => DataType::Float32,
        DType::F64 => DataType::Float64,
        DType::F16 => DataType::Float16,
        DType::BF16 => return None,
        DType::I64 => DataType::Int64,
        DType::I32 => DataType::Int32,
        DType::I16 => DataType::Int16,
        DType::I8 => DataType::Int8,
        DType::U8 => DataType::UInt8,
        DType::Bool => DataType::Boolean,
    })
}

fn castable(dt: &DataType) -> bool {
    dt.is_numeric() || *dt == DataType::Boolean
}

/// Checks `view` against `schema` and works out every tensor's shape.
pub fn resolve_view(view: &View, schema: &SchemaRef, file: &str) -> Result<Resolved, SchemaError> {
    let mut layouts = Vec::new();
    let mut tensors = Vec::new();
    let mut projection = Vec::new();
    for spec in &view.tensors {
        let err = |column: &str, problem: String| SchemaError {
            file: file.to_string(),
            tensor: spec.name.clone(),
            column: column.to_string(),
            problem,
        };
        let mut elem: Option<DataType> = None;
        let mut kind = Kind::Scalar;
        for col in &spec.columns {
            let (idx, field) =
                schema.column_with_name(col).ok_or_else(|| err(col, "no such column in the file".into()))?;
            if !projection.contains(&idx) {
                projection.push(idx);
            }
            let (this_elem, this_kind) = match field.data_type() {
                DataType::FixedSizeList(child, k) => {
                    if spec.columns.len() > 1 {
                        return Err(err(col, "a FixedSizeList column cannot be stacked with other columns".into()));
                    }
                    // The width comes from the file's schema: refuse what
                    // no tensor row can be (negative, zero, over u32).
                    let width = u32::try_from(*k).ok().filter(|&w| w > 0).ok_or_else(|| {
                        err(col, format!("is a FixedSizeList of width {k}, which no tensor can have"))
                    })?;
                    (child.data_type().clone(), Kind::List(width as usize))
                }
                dt if castable(dt) => (dt.clone(), if spec.columns.len() > 1 { Kind::Stacked } else { Kind::Scalar }),
                dt => return Err(err(col, format!("has Arrow type {dt}, which no tensor can be built from"))),
            };
            if let Some(prev) = &elem
                && *prev != this_elem
            {
                return Err(err(col, format!("has Arrow type {this_elem}, but the tensor's other columns are {prev}")));
            }
            elem = Some(this_elem);
            kind = this_kind;
        }
        let Some(elem) = elem else {
            return Err(err("", "the tensor names no column".into()));
        };
        if !castable(&elem) {
            return Err(err(&spec.columns[0], format!("has element type {elem}, which no tensor can be built from")));
        }
        let exact = arrow_type(spec.dtype).as_ref() == Some(&elem);
        if !exact && !spec.cast {
            return Err(err(
                &spec.columns[0],
                format!("has Arrow type {elem}; the view asks for {} (declare cast = true to convert)", spec.dtype),
            ));
        }
        let shape = match kind {
            Kind::Scalar => vec![],
            Kind::Stacked => vec![spec.columns.len() as u32],
            Kind::List(k) => vec![k as u32],
        };
        layouts.push(TensorLayout { name: spec.name.clone(), dtype: spec.dtype, shape });
        tensors.push(ResolvedTensor {
            name: spec.name.clone(),
            dtype: spec.dtype,
            kind,
            columns: spec.columns.clone(),
            fill: spec.fill,
        });
    }
    projection.sort_unstable();
    Ok(Resolved { layouts, projection, tensors })
}
