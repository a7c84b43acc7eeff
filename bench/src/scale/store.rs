//! The synthetic store of `granary bench scale`: real Parquet footers over
//! almost no data.

use anyhow::Result;
use std::path::Path;
use std::sync::Arc;

/// Writes `files` files of one float column `x` holding `row_groups` one-row
/// row groups in all, on every core.
pub(super) fn generate(dir: &Path, files: u64, row_groups: u64) -> Result<()> {
    use arrow::array::Float32Array;
    use arrow::datatypes::{DataType, Field, Schema};
    use arrow::record_batch::RecordBatch;
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::{EnabledStatistics, WriterProperties};
    std::fs::create_dir_all(dir)?;
    let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Float32, false)]));
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()) as u64;
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let schema = schema.clone();
                scope.spawn(move || -> Result<()> {
                    for f in (t..files).step_by(threads as usize) {
                        // The first files take the remainder.
                        let groups = row_groups / files + u64::from(f < row_groups % files);
                        let props = WriterProperties::builder()
                            .set_max_row_group_row_count(Some(1))
                            .set_statistics_enabled(EnabledStatistics::None)
                            .build();
                        let path = dir.join(format!("part-{f:06}.parquet"));
                        let mut w = ArrowWriter::try_new(std::fs::File::create(&path)?, schema.clone(), Some(props))?;
                        let values: Vec<f32> = (0..groups).map(|g| g as f32).collect();
                        let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(Float32Array::from(values))])?;
                        w.write(&batch)?;
                        w.close()?;
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join().map_err(|_| anyhow::anyhow!("a generator thread panicked"))??;
        }
        Ok(())
    })
}
