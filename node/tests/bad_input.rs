//! Bad input, end to end: every way the data, the disk or a trainer can be
//! wrong gets a clear error naming the file, row group, column or request, or
//! a transparent re-read; never a wrong tensor, never a dead daemon.
//!
//! Valid data comes from `datagen` (every value is a formula of the global
//! row, so a served tensor is checked value by value) or from small Parquet
//! files written here with `ArrowWriter`; the tests then damage it. Every
//! blocking step runs under [`within`], so a hang fails the test instead of
//! stalling the suite.

use granary_client::ClientError;
use granary_node::EmbeddedNode;
use granary_node::config::NodeConfig;
use granary_proto::rng::Rng;
use granary_proto::wire::ErrorKind;
use granary_proto::{DatasetVersion, ShardId};
use granary_testkit::datagen;
use parquet::file::reader::{FileReader, SerializedFileReader};
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

mod common;
use common::*;

/// Fetches a datagen shard that must be served, and checks every value.
fn fetch_exact(node: &Arc<EmbeddedNode>, version: DatasetVersion, shard: ShardId, first_row: u64) {
    let chunk = fetch(node, version, shard).unwrap_or_else(|e| panic!("shard {shard}: {e}"));
    if let Some(m) = datagen_mismatch(&chunk, first_row) {
        panic!("shard {shard} served a wrong tensor: {m}");
    }
}

fn footer(path: &Path) -> SerializedFileReader<std::fs::File> {
    SerializedFileReader::new(std::fs::File::open(path).expect("open parquet")).expect("read footer")
}

/// Byte range of one column chunk in a Parquet file.
fn column_chunk(path: &Path, row_group: usize, column: &str) -> Range<u64> {
    let md = footer(path).metadata().row_group(row_group).clone();
    let col = md
        .columns()
        .iter()
        .find(|c| c.column_path().string() == column)
        .unwrap_or_else(|| panic!("no column {column} in {}", path.display()));
    let (start, len) = col.byte_range();
    start..start + len
}

/// Byte range of one whole row group (all its column chunks).
fn row_group_range(path: &Path, row_group: usize) -> Range<u64> {
    let md = footer(path).metadata().row_group(row_group).clone();
    let ranges: Vec<(u64, u64)> = md.columns().iter().map(|c| c.byte_range()).collect();
    let start = ranges.iter().map(|r| r.0).min().expect("row group has columns");
    let end = ranges.iter().map(|r| r.0 + r.1).max().expect("row group has columns");
    start..end
}

/// Inverts `n` bytes of `path` at `offset`, in place.
fn flip(path: &Path, offset: u64, n: usize) {
    at_rest(path, || {
        let f = std::fs::OpenOptions::new().read(true).write(true).open(path).expect("open for damage");
        let mut buf = vec![0u8; n];
        f.read_exact_at(&mut buf, offset).expect("read bytes to damage");
        for b in &mut buf {
            *b ^= 0xFF;
        }
        f.write_all_at(&buf, offset).expect("write damaged bytes");
        f.sync_all().expect("sync damaged file");
    });
}

/// Changes a file's bytes as its store cannot see it (bytes rotted at
/// rest): the file keeps its inode, size and modification time, and so
/// its ETag on the local filesystem, which reads are pinned to. These
/// tests are about what the decoder makes of bad bytes; an overwrite the
/// store does see is refused before any decode (`tests/pinned_reads.rs`).
fn at_rest(path: &Path, change: impl FnOnce()) {
    let before = std::fs::metadata(path).expect("stat").modified().expect("mtime");
    change();
    let f = std::fs::OpenOptions::new().write(true).open(path).expect("open");
    f.set_times(std::fs::FileTimes::new().set_modified(before)).expect("restore the modification time");
}

/// Writes `batches` as a Parquet file, one row group per batch.
// ---------------------------------------------------------------------------
// Truncated and corrupt Parquet
// ---------------------------------------------------------------------------

#[test]
fn parquet_truncated_before_open_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let files = generate(dir.path(), 2, 600, 300, "snappy");
    let whole = std::fs::read(&files[1]).unwrap();
    // Empty, shorter than the magic, magic only, footer cut, last byte gone.
    for cut in [0, 3, 4, whole.len() / 2, whole.len() - 1] {
        std::fs::write(&files[1], &whole[..cut]).unwrap();
        let message = start_refused(config(dir.path(), parse_view(datagen::VIEW_TOML)));
        assert_names(&message, &["part-00001.parquet"]);
        assert!(!message.contains("part-00000.parquet"), "blames the intact file: {message}");
    }
}

#[test]
fn parquet_truncated_after_open_fails_its_row_groups_naming_file_and_row_group() {
    let dir = tempfile::tempdir().unwrap();
    let files = generate(dir.path(), 1, 900, 300, "snappy");
    let node = start(config(dir.path(), parse_view(datagen::VIEW_TOML)));
    let info = describe(&node);
    let shards = first_rows(&info);
    assert_eq!(shards.len(), 3);
    // The footer is already decoded; cut the file in the middle of row group
    // 1. Its size, so its ETag, changed: every read of it is refused as a
    // changed file, naming it and the row group, before any decode.
    let whole = std::fs::read(&files[0]).unwrap();
    let registered = std::fs::metadata(&files[0]).unwrap().modified().unwrap();
    let rg1 = row_group_range(&files[0], 1);
    let f = std::fs::OpenOptions::new().write(true).open(&files[0]).unwrap();
    f.set_len(rg1.start + (rg1.end - rg1.start) / 2).unwrap();
    drop(f);
    for (rg, (shard, _)) in shards.iter().enumerate() {
        let (kind, message) = fetch_refused(&node, info.version, *shard);
        assert_eq!(kind, ErrorKind::BadInput, "{message}");
        assert_names(&message, &["part-00000.parquet", &format!("row group {rg}"), "changed since"]);
    }
    // The node is unharmed: with the registered object back (bytes and
    // modification time), every shard is served, exactly.
    std::fs::write(&files[0], &whole).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(&files[0]).unwrap();
    f.set_times(std::fs::FileTimes::new().set_modified(registered)).unwrap();
    for (shard, first) in &shards {
        fetch_exact(&node, info.version, *shard, *first);
    }
}

// Damage inside page *values* is only detectable where something checksums
// them. parquet-rs writes no page CRCs, and of its codecs only gzip carries a
// checksum: one flipped byte in an uncompressed, snappy, zstd or lz4 page of
// a datagen file decodes to a wrong value without any error (checked by hand
// for this test file). Hence the tests below damage page headers, gzip pages,
// and pages that carry a CRC, where detection is possible.

#[test]
fn corrupt_page_header_is_an_error_naming_file_and_row_group() {
    let dir = tempfile::tempdir().unwrap();
    let files = generate(dir.path(), 1, 900, 300, "snappy");
    let node = start(config(dir.path(), parse_view(datagen::VIEW_TOML)));
    let info = describe(&node);
    let shards = first_rows(&info);
    // The first bytes of a column chunk are its first page header (thrift).
    let label = column_chunk(&files[0], 1, "label");
    flip(&files[0], label.start, 16);
    let (kind, message) = fetch_refused(&node, info.version, shards[1].0);
    assert_eq!(kind, ErrorKind::BadInput, "{message}");
    assert_names(&message, &["part-00000.parquet", "row group 1"]);
    fetch_exact(&node, info.version, shards[0].0, shards[0].1);
    fetch_exact(&node, info.version, shards[2].0, shards[2].1);
}

#[test]
fn corrupt_gzip_page_is_an_error_naming_file_and_row_group() {
    // gzip is the one codec whose frames carry a checksum (CRC-32) that the
    // Parquet reader verifies, so damage inside page data is detectable.
    let dir = tempfile::tempdir().unwrap();
    let files = generate(dir.path(), 1, 900, 300, "gzip");
    let node = start(config(dir.path(), parse_view(datagen::VIEW_TOML)));
    let info = describe(&node);
    let shards = first_rows(&info);
    let f7 = column_chunk(&files[0], 1, "f7");
    flip(&files[0], f7.start + (f7.end - f7.start) / 2, 8);
    let (kind, message) = fetch_refused(&node, info.version, shards[1].0);
    assert_eq!(kind, ErrorKind::BadInput, "{message}");
    assert_names(&message, &["part-00000.parquet", "row group 1"]);
    fetch_exact(&node, info.version, shards[0].0, shards[0].1);
    fetch_exact(&node, info.version, shards[2].0, shards[2].1);
}

#[test]
fn missing_object_fails_its_shards_naming_the_path_until_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let files = generate(dir.path(), 2, 1_200, 300, "snappy");
    let node = start(config(dir.path(), parse_view(datagen::VIEW_TOML)));
    let info = describe(&node);
    let shards = first_rows(&info);
    // Moved away and back (the same object: inode and modification time,
    // so the ETag its reads are pinned to, are kept).
    let aside = dir.path().join("aside");
    std::fs::rename(&files[1], &aside).unwrap();
    let lost: Vec<_> = shards.iter().filter(|(s, _)| s.file == 1).copied().collect();
    assert_eq!(lost.len(), 2);
    for (shard, _) in &lost {
        let (kind, message) = fetch_refused(&node, info.version, *shard);
        assert_ne!(kind, ErrorKind::BadRequest, "{message}");
        assert_names(&message, &["part-00001.parquet"]);
    }
    fetch_exact(&node, info.version, shards[0].0, shards[0].1);
    // A failed load is not remembered: once the object is back, it is served.
    std::fs::rename(&aside, &files[1]).unwrap();
    for (shard, first) in &lost {
        fetch_exact(&node, info.version, *shard, *first);
    }
}

/// CRC-32 (IEEE), as Parquet page headers carry it.
fn crc32(data: &[u8]) -> u32 {
    let mut c = !0u32;
    for &b in data {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 == 1 { (c >> 1) ^ 0xEDB8_8320 } else { c >> 1 };
        }
    }
    !c
}

/// A thrift compact-protocol i32 (zigzag varint).
fn thrift_i32(out: &mut Vec<u8>, v: i32) {
    let mut z = ((v << 1) ^ (v >> 31)) as u32;
    while z >= 0x80 {
        out.push((z as u8 & 0x7F) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

/// One uncompressed PLAIN data page of required i64 values whose header
/// carries the page's CRC-32, as writers with page checksums on produce it
/// (parquet-mr, Arrow C++). The Rust writer never writes page CRCs, so the
/// header is encoded here.
fn page_with_crc(values: &[i64]) -> Vec<u8> {
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    let len = i32::try_from(data.len()).expect("small page");
    let mut page = Vec::new();
    // PageHeader: 1 type = DATA_PAGE, 2 uncompressed size, 3 compressed size, 4 crc.
    for v in [0, len, len, crc32(&data) as i32] {
        page.push(0x15);
        thrift_i32(&mut page, v);
    }
    // 5 DataPageHeader: 1 values, 2 encoding PLAIN, 3 and 4 level encodings RLE.
    page.push(0x1C);
    for v in [values.len() as i32, 0, 3, 3] {
        page.push(0x15);
        thrift_i32(&mut page, v);
    }
    page.extend_from_slice(&[0, 0]);
    page.extend_from_slice(&data);
    page
}

/// Writes a file of one required i64 column `v`, one CRC-carrying page per
/// row group; returns the byte offset of each page's values.
fn write_crc_parquet(path: &Path, row_groups: &[Vec<i64>]) -> Vec<u64> {
    use parquet::basic::{Compression, Encoding};
    use parquet::column::writer::ColumnCloseResult;
    use parquet::file::metadata::ColumnChunkMetaData;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::types::SchemaDescriptor;
    let schema = Arc::new(parquet::schema::parser::parse_message_type("message m { required int64 v; }").unwrap());
    let descr = SchemaDescriptor::new(schema.clone()).column(0);
    let file = std::fs::File::create(path).unwrap();
    let mut w = SerializedFileWriter::new(file, schema, Default::default()).unwrap();
    let mut value_offsets = Vec::new();
    for values in row_groups {
        let page = page_with_crc(values);
        let len = page.len() as i64;
        let metadata = ColumnChunkMetaData::builder(descr.clone())
            .set_encodings(vec![Encoding::PLAIN])
            .set_compression(Compression::UNCOMPRESSED)
            .set_num_values(values.len() as i64)
            .set_total_compressed_size(len)
            .set_total_uncompressed_size(len)
            .set_data_page_offset(0)
            .build()
            .unwrap();
        let close = ColumnCloseResult {
            bytes_written: len as u64,
            rows_written: values.len() as u64,
            metadata,
            bloom_filter: None,
            column_index: None,
            offset_index: None,
        };
        let mut rg = w.next_row_group().unwrap();
        rg.append_column(&bytes::Bytes::from(page), close).unwrap();
        let md = rg.close().unwrap();
        let (start, chunk_len) = md.column(0).byte_range();
        value_offsets.push(start + chunk_len - 8 * values.len() as u64);
    }
    w.close().unwrap();
    value_offsets
}

/// A row group without rows (valid Parquet, which some writers leave) is a
/// shard whose chunk holds no rows; the row groups around it are served
/// exactly.
#[test]
fn a_row_group_without_rows_is_an_empty_shard() {
    use parquet::data_type::Int64Type;
    use parquet::file::writer::SerializedFileWriter;
    let dir = tempfile::tempdir().unwrap();
    let schema = Arc::new(parquet::schema::parser::parse_message_type("message m { required int64 v; }").unwrap());
    let groups: Vec<Vec<i64>> = vec![vec![1, 2, 3], vec![], vec![4, 5]];
    let file = std::fs::File::create(dir.path().join("sparse.parquet")).unwrap();
    let mut w = SerializedFileWriter::new(file, schema, Default::default()).unwrap();
    for values in &groups {
        let mut rg = w.next_row_group().unwrap();
        let mut col = rg.next_column().unwrap().expect("one column");
        col.typed::<Int64Type>().write_batch(values, None, None).unwrap();
        col.close().unwrap();
        rg.close().unwrap();
    }
    w.close().unwrap();
    let node = start(config(dir.path(), parse_view("[[tensor]]\nname = \"v\"\ndtype = \"i64\"\ncolumns = [\"v\"]\n")));
    let info = describe(&node);
    assert_eq!(info.shards.len(), groups.len(), "every row group is a shard");
    for (shard, values) in info.shards.iter().zip(&groups) {
        assert_eq!(shard.rows, values.len() as u64);
        let chunk = fetch(&node, info.version, shard.shard).expect("served");
        assert_eq!(i64s(chunk.tensor_bytes(0)), *values, "{}", shard.shard);
    }
}

#[test]
fn corrupt_page_with_a_crc_is_an_error_naming_file_and_row_group() {
    assert_eq!(crc32(b"123456789"), 0xCBF4_3926, "the CRC-32 used in page headers");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crc.parquet");
    let groups: Vec<Vec<i64>> = (0..3).map(|g| (0..300).map(|r| g * 1_000_000 + r * 7).collect()).collect();
    let value_offsets = write_crc_parquet(&path, &groups);
    let node = start(config(dir.path(), parse_view("[[tensor]]\nname = \"v\"\ndtype = \"i64\"\ncolumns = [\"v\"]\n")));
    let info = describe(&node);
    assert_eq!(info.shards.len(), 3);
    // Intact pages read back exactly (with CRC checks on, this also shows
    // that the CRCs written here are right).
    for g in [0, 2] {
        let chunk = fetch(&node, info.version, info.shards[g].shard).unwrap();
        assert_eq!(i64s(chunk.tensor_bytes(0)), groups[g]);
    }
    // One flipped byte in the values of row group 1.
    flip(&path, value_offsets[1] + 8 * 150 + 3, 1);
    match fetch(&node, info.version, info.shards[1].shard) {
        Err(ClientError::Node { kind, message }) => {
            assert_eq!(kind, ErrorKind::BadInput, "{message}");
            assert_names(&message, &["crc.parquet", "row group 1"]);
        }
        Err(other) => panic!("expected a node error, got {other}"),
        Ok(chunk) => {
            let served = i64s(chunk.tensor_bytes(0));
            let wrong = served.iter().zip(&groups[1]).position(|(a, b)| a != b);
            panic!("a page failing its CRC was served; first wrong value at row {wrong:?}");
        }
    }
}

/// Offset of the encoding of the first data page in a column chunk written
/// by parquet-rs (thrift compact: type, sizes, then the data page header's
/// value count and encoding). Asserts the layout it walks.
fn data_page_encoding_at(bytes: &[u8], chunk_start: usize) -> usize {
    let mut at = chunk_start;
    let i32_field = |at: &mut usize| {
        assert_eq!(bytes[*at], 0x15, "expected an i32 field at {at}");
        *at += 1;
        while bytes[*at] & 0x80 != 0 {
            *at += 1;
        }
        *at += 1;
    };
    for _ in 0..3 {
        i32_field(&mut at); // type, uncompressed size, compressed size
    }
    assert_eq!(bytes[at], 0x2C, "expected the data page header (field 5) at {at}");
    at += 1;
    i32_field(&mut at); // value count
    assert_eq!(&bytes[at..at + 2], &[0x15, 0x00], "expected encoding PLAIN at {at}");
    at + 1
}

#[test]
fn page_header_that_panics_the_decoder_is_an_error_and_does_not_poison_the_shard() {
    let dir = tempfile::tempdir().unwrap();
    let files = generate(dir.path(), 1, 900, 300, "snappy");
    let node = start(config(dir.path(), parse_view(datagen::VIEW_TOML)));
    let info = describe(&node);
    let shards = first_rows(&info);
    // A data page that claims dictionary encoding (RLE_DICTIONARY = 8, zigzag
    // 0x10) in a column chunk without a dictionary page: the Parquet decoder
    // panics on it instead of returning an error.
    let whole = std::fs::read(&files[0]).unwrap();
    let f7 = column_chunk(&files[0], 1, "f7");
    let mut damaged = whole.clone();
    damaged[data_page_encoding_at(&whole, f7.start as usize)] = 0x10;
    at_rest(&files[0], || std::fs::write(&files[0], &damaged).unwrap());
    let (kind, message) = fetch_refused(&node, info.version, shards[1].0);
    assert_names(&message, &["part-00000.parquet", "row group 1"]);
    assert_eq!(kind, ErrorKind::BadInput, "{message}");
    fetch_exact(&node, info.version, shards[0].0, shards[0].1);
    // Once the file is repaired the shard is served: the failed load left
    // nothing behind.
    at_rest(&files[0], || std::fs::write(&files[0], &whole).unwrap());
    fetch_exact(&node, info.version, shards[1].0, shards[1].1);
}

// ---------------------------------------------------------------------------
// The SSD tier
// ---------------------------------------------------------------------------

#[test]
fn unwritable_ssd_folder_is_refused_naming_it() {
    // Tests may run as root, which ignores permission bits: use folders that
    // no one can create instead.
    let tmp = tempfile::tempdir().unwrap();
    let blocker = tmp.path().join("blocker");
    std::fs::write(&blocker, b"a regular file").unwrap();
    for ssd_dir in [blocker.join("sub"), blocker.clone()] {
        let cfg = NodeConfig { ssd_dir: Some(ssd_dir.clone()), ssd_bytes: 16 << 20, ..NodeConfig::default() };
        let message = start_refused(cfg);
        assert_names(&message, &[&ssd_dir.display().to_string(), "SSD"]);
    }
}

fn ssd_config(data: &Path, ssd: &Path) -> NodeConfig {
    NodeConfig {
        ssd_dir: Some(ssd.to_path_buf()),
        ssd_bytes: 16 << 20,
        ssd_block_bytes: 1 << 20,
        // One byte of RAM: nothing stays in memory, chunks live on SSD.
        ram_bytes: 1,
        ..config(data, parse_view(datagen::VIEW_TOML))
    }
}

/// Every chunk stored in the SSD folder: (file, offset of its magic, length).
fn chunks_on_disk(ssd: &Path) -> Vec<(PathBuf, usize, usize)> {
    let mut found = Vec::new();
    let mut paths: Vec<PathBuf> = std::fs::read_dir(ssd).unwrap().map(|e| e.unwrap().path()).collect();
    paths.sort();
    for p in paths {
        if !p.is_file() {
            continue;
        }
        let bytes = std::fs::read(&p).unwrap();
        let magic = granary_proto::chunk::MAGIC;
        let mut at = 0;
        while let Some(i) = bytes[at..].windows(magic.len()).position(|w| w == magic) {
            let start = at + i;
            let len = u64::from_le_bytes(bytes[start + 24..start + 32].try_into().unwrap()) as usize;
            found.push((p.clone(), start, len));
            at = start + magic.len();
        }
    }
    found
}

/// Closes a node and waits for its runtime to finish.
fn close(node: Arc<EmbeddedNode>) {
    within("node close", move || {
        let node = Arc::try_unwrap(node).unwrap_or_else(|_| panic!("node still shared"));
        node.block_on(node.node().close());
    });
}

#[test]
fn corrupt_ssd_entry_is_reread_transparently() {
    let data = tempfile::tempdir().unwrap();
    let ssd = tempfile::tempdir().unwrap();
    generate(data.path(), 2, 2_400, 300, "snappy");

    // First life: convert everything; every chunk lands on SSD.
    let node = start(ssd_config(data.path(), ssd.path()));
    let info = describe(&node);
    let shards = first_rows(&info);
    assert_eq!(shards.len(), 8);
    for (shard, first) in &shards {
        fetch_exact(&node, info.version, *shard, *first);
    }
    assert_eq!(node.node().stats().conversions, 8);
    close(node);

    let on_disk = chunks_on_disk(ssd.path());
    assert_eq!(on_disk.len(), 8, "every chunk is on SSD: {on_disk:?}");
    // Damage two entries: one byte of a tensor payload, one of a chunk header.
    let (file, at, len) = &on_disk[0];
    flip(file, (*at + len / 2) as u64, 1);
    let (file, at, _) = &on_disk[5];
    flip(file, (*at + 40) as u64, 1);

    // Second life: the intact chunks are recovered, the damaged ones re-read.
    let node = start(ssd_config(data.path(), ssd.path()));
    assert_eq!(describe(&node).version, info.version);
    for (shard, first) in &shards {
        fetch_exact(&node, info.version, *shard, *first);
    }
    // foyer's own entry checksum catches the damage and reports a plain
    // miss, so the re-reads show as misses, not as `corrupt_entries`.
    let s = node.node().stats();
    assert_eq!(s.conversions, 2, "exactly the damaged entries are read again: {s:?}");
    assert_eq!(s.misses, 2, "{s:?}");
    assert_eq!(s.ssd_hits, 6, "the intact entries come from SSD: {s:?}");
    close(node);

    // Third life: the re-read chunks replaced the damaged entries.
    let node = start(ssd_config(data.path(), ssd.path()));
    for (shard, first) in &shards {
        fetch_exact(&node, info.version, *shard, *first);
    }
    let s = node.node().stats();
    assert_eq!((s.conversions, s.ssd_hits), (0, 8), "{s:?}");
    close(node);
}

#[test]
fn randomly_damaged_ssd_folder_never_serves_a_wrong_tensor() {
    let data = tempfile::tempdir().unwrap();
    generate(data.path(), 2, 2_400, 300, "snappy");
    for seed in 0..3u64 {
        let ssd = tempfile::tempdir().unwrap();
        let node = start(ssd_config(data.path(), ssd.path()));
        let info = describe(&node);
        let shards = first_rows(&info);
        for (shard, first) in &shards {
            fetch_exact(&node, info.version, *shard, *first);
        }
        close(node);
        // Thirty flipped bytes anywhere in the block files, half of them in
        // the first page of a block, where foyer keeps its index.
        let mut files: Vec<PathBuf> = std::fs::read_dir(ssd.path()).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        let mut rng = Rng::new(seed);
        for _ in 0..30 {
            let file = &files[rng.below(files.len() as u64) as usize];
            let len = std::fs::metadata(file).unwrap().len();
            let at = if rng.below(2) == 0 { rng.below(4096) } else { rng.below(len) };
            flip(file, at, 1);
        }
        let node = start(ssd_config(data.path(), ssd.path()));
        for (shard, first) in &shards {
            let chunk = fetch(&node, info.version, *shard).unwrap_or_else(|e| panic!("seed {seed}: {shard}: {e}"));
            if let Some(m) = datagen_mismatch(&chunk, *first) {
                panic!("seed {seed}: {shard} served a wrong tensor: {m}");
            }
        }
        close(node);
    }
}

/// An object that got shorter after it was listed: object_store clamps a
/// range read to the object's current size, so the footer read returns
/// fewer bytes than asked. That is an error naming the file and saying it
/// changed (it used to slice past the returned bytes and panic).
#[test]
fn an_object_shorter_than_listed_is_an_error_not_a_panic() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let files = generate(tmp.path(), 1, 4_000, 1_000, "snappy");
    let dir = tmp.path().to_path_buf();
    let message = within("footer of a shrunk object", move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async move {
            let counters = Arc::new(granary_source::remote::RemoteCounters::default());
            let remote = granary_source::remote::Remote::open(
                &format!("file://{}", dir.display()),
                &std::collections::BTreeMap::new(),
                None,
                counters,
            )
            .expect("open");
            let listed = remote.list_parquet().await.expect("list");
            // As listed when it was 60 KB longer than it is now.
            let mut file = remote.file(listed[0].location.clone(), listed[0].size + 60_000);
            file.footer_bytes().await.expect_err("a shorter object").to_string()
        })
    });
    let name = files[0].file_name().expect("name").to_string_lossy().to_string();
    assert_names(&message, &[&name, "changed since it was listed"]);
}
