//! A file's footer as a node keeps it (issue 42): one small footer per row
//! group instead of the whole decoded footer.
//!
//! A decoded footer takes about 420 bytes per column chunk, five to six
//! times its bytes in the file: 16,000 row groups of 154 columns held
//! 1.2 GB of a node's memory, and a million row groups would hold tens of
//! GB. A load needs one row group's column chunks, so once a footer is
//! read and checked, [`Footer::split`] encodes each row group as a footer
//! of its own (the schema, without the writer's key-value metadata, and
//! that one row group without its statistics: thrift, as in the file) and
//! keeps those bytes, about 8 KB for a row group of 154 columns; a
//! load decodes only its row group's ([`Footer::row_group`]). The Arrow
//! schema the whole footer gave is kept once and handed to every decode,
//! so a row group reads to the same Arrow types as from the whole footer.

use crate::error::RemoteError;
use crate::schema::Resolved;
use arrow::datatypes::SchemaRef;
use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
use parquet::file::metadata::{FileMetaData, ParquetMetaData, ParquetMetaDataBuilder, ParquetMetaDataWriter};
use std::sync::Arc;

/// A file's footer: each row group's own footer, the Arrow schema and the
/// view resolved against it, and (where the node serves footers to peers)
/// the footer's bytes as stored.
pub struct Footer {
    /// The footer as stored at the end of the file, kept where peers may
    /// ask for it; `None` where it is not kept.
    pub raw: Option<bytes::Bytes>,
    /// The Arrow schema the whole footer decodes to.
    pub schema: SchemaRef,
    /// The view resolved against this file's schema.
    pub resolved: Arc<Resolved>,
    /// Each row group's own footer, in the file's order.
    row_groups: Vec<bytes::Bytes>,
}

impl Footer {
    /// Splits a decoded and checked footer (`metadata`, of the file shown
    /// as `path`) into one footer per row group; keeps `raw` if given.
    pub fn split(
        path: &str,
        metadata: &ArrowReaderMetadata,
        resolved: Arc<Resolved>,
        raw: Option<bytes::Bytes>,
    ) -> Result<Self, RemoteError> {
        let md = metadata.metadata();
        let file = md.file_metadata();
        let bare = FileMetaData::new(
            file.version(),
            file.num_rows(),
            file.created_by().map(str::to_string),
            None,
            file.schema_descr_ptr(),
            file.column_orders().cloned(),
        );
        let row_groups = md
            .row_groups()
            .iter()
            .map(|rg| {
                let bad = |source| RemoteError::Parquet { path: path.to_string(), source };
                // A read needs no statistics: they are dropped.
                let columns = rg
                    .columns()
                    .iter()
                    .map(|c| {
                        c.clone()
                            .into_builder()
                            .clear_statistics()
                            .set_repetition_level_histogram(None)
                            .set_definition_level_histogram(None)
                            .build()
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(bad)?;
                let rg = rg.clone().into_builder().set_column_metadata(columns).build().map_err(bad)?;
                let one = ParquetMetaDataBuilder::new(bare.clone()).set_row_groups(vec![rg]).build();
                let mut buf = Vec::new();
                ParquetMetaDataWriter::new(&mut buf, &one).with_write_path_in_schema(false).finish().map_err(bad)?;
                Ok(bytes::Bytes::from(buf))
            })
            .collect::<Result<Vec<_>, RemoteError>>()?;
        Ok(Self { raw, schema: metadata.schema().clone(), resolved, row_groups })
    }

    /// Row group `rg`'s footer decoded, for a reader of that one row group
    /// (its index there is 0); errors name `path` and the row group.
    pub fn row_group(&self, path: &str, rg: usize) -> Result<ArrowReaderMetadata, RemoteError> {
        let site = format!("{path} row group {rg}");
        let bad = |source| RemoteError::Parquet { path: site.clone(), source };
        let raw = self.row_groups.get(rg).ok_or_else(|| {
            bad(parquet::errors::ParquetError::General(format!("the footer has {} row groups", self.row_groups.len())))
        })?;
        let md: ParquetMetaData = crate::remote::decode_footer(&site, raw)?;
        ArrowReaderMetadata::try_new(Arc::new(md), ArrowReaderOptions::new().with_schema(self.schema.clone()))
            .map_err(bad)
    }

    /// The file's row groups.
    pub fn row_group_count(&self) -> usize {
        self.row_groups.len()
    }

    /// Bytes this footer holds in memory.
    pub fn held_bytes(&self) -> usize {
        self.raw.as_ref().map_or(0, |r| r.len()) + self.row_groups.iter().map(|r| r.len()).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{ArrayRef, Float32Array, ListArray, RecordBatch, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;

    /// A file of `groups` row groups of 3 rows: an f32, a list of i64 and
    /// a dictionary-encoded string column.
    fn file(groups: usize) -> bytes::Bytes {
        let schema = Arc::new(Schema::new(vec![
            Field::new("x", DataType::Float32, false),
            Field::new("ids", DataType::List(Arc::new(Field::new("item", DataType::Int64, true))), true),
            Field::new("s", DataType::Utf8, false),
        ]));
        let props = WriterProperties::builder().set_max_row_group_row_count(Some(3)).build();
        let mut buf = Vec::new();
        let mut w = ArrowWriter::try_new(&mut buf, schema.clone(), Some(props)).unwrap();
        for g in 0..groups {
            let base = g as i64 * 10;
            let ids = ListArray::from_iter_primitive::<arrow::datatypes::Int64Type, _, _>(vec![
                Some(vec![Some(base)]),
                None,
                Some(vec![Some(base + 1), Some(base + 2)]),
            ]);
            let cols: Vec<ArrayRef> = vec![
                Arc::new(Float32Array::from(vec![g as f32, 0.5, 1.5])),
                Arc::new(ids),
                Arc::new(StringArray::from(vec!["a", "b", "a"])),
            ];
            w.write(&RecordBatch::try_new(schema.clone(), cols).unwrap()).unwrap();
        }
        w.close().unwrap();
        bytes::Bytes::from(buf)
    }

    fn whole(data: &bytes::Bytes) -> ArrowReaderMetadata {
        ArrowReaderMetadata::load(data, ArrowReaderOptions::new()).unwrap()
    }

    fn read(data: &bytes::Bytes, md: ArrowReaderMetadata, rg: usize) -> RecordBatch {
        let r = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::new_with_metadata(data.clone(), md)
            .with_row_groups(vec![rg])
            .build()
            .unwrap();
        let batches: Vec<_> = r.map(|b| b.unwrap()).collect();
        arrow::compute::concat_batches(&batches[0].schema(), &batches).unwrap()
    }

    /// Every row group read through its own footer is the row group read
    /// through the whole footer: same rows, same Arrow types.
    #[test]
    fn each_row_groups_own_footer_reads_what_the_whole_footer_reads() {
        let data = file(5);
        let md = whole(&data);
        let resolved = Arc::new(Resolved::default());
        let footer = Footer::split("f.parquet", &md, resolved, None).unwrap();
        assert_eq!(footer.row_groups.len(), 5);
        for rg in 0..5 {
            let own = footer.row_group("f.parquet", rg).unwrap();
            assert_eq!(own.metadata().num_row_groups(), 1);
            assert_eq!(read(&data, own, 0), read(&data, md.clone(), rg), "row group {rg}");
        }
        let err = footer.row_group("f.parquet", 5).err().unwrap().to_string();
        assert!(err.contains("f.parquet row group 5") && err.contains("has 5 row groups"), "{err}");
    }

    /// The pieces hold far less than the decoded footer they replace.
    #[test]
    fn the_pieces_are_smaller_than_the_decoded_footer() {
        let data = file(200);
        let md = whole(&data);
        let footer = Footer::split("f.parquet", &md, Arc::new(Resolved::default()), None).unwrap();
        let decoded = md.metadata().memory_size();
        assert!(footer.held_bytes() * 2 < decoded, "{} bytes of pieces, {decoded} decoded", footer.held_bytes());
    }
}
