//! GGUF v2/v3 files: a hand-written parser over a memory map and HF tensor names (what
//! the quantised types mean is `ggml_quants`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use super::{decode_le_bytes, map_file, ElementType, HostTensor, QuantType, TensorData};

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
}

impl GgufValue {
    /// The value as an integer, for any integer type (and bool).
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::I8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::I16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::I32(v) => Some(v.into()),
            GgufValue::U64(v) => i64::try_from(v).ok(),
            GgufValue::I64(v) => Some(v),
            GgufValue::Bool(v) => Some(v.into()),
            _ => None,
        }
    }

    /// The value as a float, for float and integer types.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }
}

/// The ggml element types this loader reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Quant(QuantType),
}

impl GgmlType {
    fn from_id(id: u32) -> Option<GgmlType> {
        match id {
            0 => Some(GgmlType::F32),
            1 => Some(GgmlType::F16),
            30 => Some(GgmlType::BF16),
            _ => QuantType::from_id(id).map(GgmlType::Quant),
        }
    }

    /// (elements per block, bytes per block).
    fn block(self) -> (usize, usize) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::BF16 => (1, 2),
            GgmlType::Quant(q) => (q.block_elems(), q.block_bytes()),
        }
    }
}

/// Where a tensor lives in the file.
#[derive(Debug, Clone)]
pub struct GgufTensorInfo {
    /// The name in the GGUF file (`blk.0.attn_q.weight`).
    pub gguf_name: String,
    /// Dimensions in HF order (slowest first; GGUF stores them fastest first).
    pub shape: Vec<usize>,
    pub dtype: GgmlType,
    /// Absolute byte offset of the data in the file.
    pub offset: usize,
    pub n_bytes: usize,
}

/// A parsed GGUF file: metadata and tensor directory over a memory map.
pub struct GgufFile {
    path: PathBuf,
    mmap: memmap2::Mmap,
    pub version: u32,
    pub metadata: HashMap<String, GgufValue>,
    /// Tensors by their GGUF name.
    pub tensors: HashMap<String, GgufTensorInfo>,
}

/// Bounds-checked little-endian reader over the header.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> anyhow::Result<&'a [u8]> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len());
        let Some(end) = end else {
            bail!(
                "truncated GGUF file {}: header cut short at byte {} while reading {what} ({n} bytes needed, file has {})",
                self.path.display(),
                self.pos,
                self.bytes.len()
            );
        };
        let slice = &self.bytes[self.pos..end];
        self.pos = end;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, what: &str) -> anyhow::Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u32(&mut self, what: &str) -> anyhow::Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> anyhow::Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A length or count, checked against the bytes left so that a corrupt
    /// count cannot trigger a huge allocation.
    fn count(&mut self, min_item_bytes: usize, what: &str) -> anyhow::Result<usize> {
        let n = self.u64(what)?;
        let left = (self.bytes.len() - self.pos) as u64;
        if n.saturating_mul(min_item_bytes.max(1) as u64) > left {
            bail!(
                "truncated GGUF file {}: {what} claims {n} items at byte {} but only {left} bytes remain",
                self.path.display(),
                self.pos
            );
        }
        Ok(n as usize)
    }

    fn string(&mut self, what: &str) -> anyhow::Result<String> {
        let len = self.count(1, what)?;
        let bytes = self.take(len, what)?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    fn value(&mut self, type_id: u32, key: &str) -> anyhow::Result<GgufValue> {
        Ok(match type_id {
            0 => GgufValue::U8(self.array::<1>(key)?[0]),
            1 => GgufValue::I8(i8::from_le_bytes(self.array(key)?)),
            2 => GgufValue::U16(u16::from_le_bytes(self.array(key)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array(key)?)),
            4 => GgufValue::U32(self.u32(key)?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array(key)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array(key)?)),
            7 => GgufValue::Bool(self.array::<1>(key)?[0] != 0),
            8 => GgufValue::String(self.string(key)?),
            9 => {
                let elem_type = self.u32(key)?;
                if elem_type == 9 {
                    bail!(
                        "nested arrays in metadata key `{key}` of {} are not supported",
                        self.path.display()
                    );
                }
                let n = self.count(1, key)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(elem_type, key)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(self.u64(key)?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array(key)?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array(key)?)),
            other => bail!(
                "unknown metadata value type {other} for key `{key}` in {}",
                self.path.display()
            ),
        })
    }
}

const GGUF_MAGIC: &[u8; 4] = b"GGUF";

impl GgufFile {
    /// Parses the header, metadata and tensor directory; checks that every
    /// tensor's data lies inside the file.
    pub fn open(path: &Path) -> anyhow::Result<GgufFile> {
        let mmap = map_file(path)?;
        let mut r = Reader {
            bytes: &mmap,
            pos: 0,
            path,
        };
        let magic = r.array::<4>("the magic number")?;
        if &magic != GGUF_MAGIC {
            bail!("{} is not a GGUF file (magic {magic:?})", path.display());
        }
        let version = r.u32("the version")?;
        if !(2..=3).contains(&version) {
            bail!(
                "unsupported GGUF version {version} in {} (supported: 2, 3)",
                path.display()
            );
        }
        let n_tensors = r.count(24, "the tensor count")?;
        let n_kv = r.count(12, "the metadata count")?;

        let mut metadata = HashMap::with_capacity(n_kv);
        for i in 0..n_kv {
            let key = r.string(&format!("metadata key #{i}"))?;
            let type_id = r.u32(&key)?;
            let value = r.value(type_id, &key)?;
            metadata.insert(key, value);
        }

        let mut raw = Vec::with_capacity(n_tensors);
        for i in 0..n_tensors {
            let name = r.string(&format!("the name of tensor #{i}"))?;
            let n_dims = r.u32(&name)? as usize;
            if n_dims > 4 {
                bail!(
                    "tensor `{name}` in {} has {n_dims} dimensions (at most 4)",
                    path.display()
                );
            }
            let mut dims = Vec::with_capacity(n_dims);
            for _ in 0..n_dims {
                dims.push(r.u64(&name)? as usize);
            }
            let type_id = r.u32(&name)?;
            let offset = r.u64(&name)?;
            raw.push((name, dims, type_id, offset));
        }

        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => match v.as_i64() {
                Some(a) if a > 0 => a as usize,
                _ => bail!("invalid general.alignment {v:?} in {}", path.display()),
            },
        };
        let data_start = r.pos.div_ceil(alignment) * alignment;

        let mut tensors = HashMap::with_capacity(raw.len());
        for (name, dims, type_id, offset) in raw {
            let dtype = GgmlType::from_id(type_id).with_context(|| {
                format!(
                    "tensor `{name}` in {} has unsupported ggml type {type_id} (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, MXFP4)",
                    path.display()
                )
            })?;
            let numel = dims
                .iter()
                .try_fold(1usize, |acc, &d| acc.checked_mul(d))
                .with_context(|| format!("tensor `{name}` in {} is too large", path.display()))?;
            let (block_elems, block_bytes) = dtype.block();
            if dims
                .first()
                .is_some_and(|&d0| !d0.is_multiple_of(block_elems))
            {
                bail!(
                    "tensor `{name}` in {}: row length {} is not a multiple of the {dtype:?} block size {block_elems}",
                    path.display(),
                    dims[0]
                );
            }
            let n_bytes = numel / block_elems * block_bytes;
            let begin = data_start.checked_add(offset as usize);
            let end = begin.and_then(|b| b.checked_add(n_bytes));
            let (Some(begin), Some(end)) = (begin, end) else {
                bail!(
                    "tensor `{name}` in {} has an invalid offset",
                    path.display()
                );
            };
            if end > mmap.len() {
                bail!(
                    "truncated GGUF file {}: data of tensor `{name}` spans bytes {begin}..{end} but the file has {}",
                    path.display(),
                    mmap.len()
                );
            }
            let shape = dims.into_iter().rev().collect();
            let info = GgufTensorInfo {
                gguf_name: name.clone(),
                shape,
                dtype,
                offset: begin,
                n_bytes,
            };
            tensors.insert(name, info);
        }

        Ok(GgufFile {
            path: path.to_path_buf(),
            mmap,
            version,
            metadata,
            tensors,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A required metadata value; the error names the key and the file.
    pub fn get(&self, key: &str) -> anyhow::Result<&GgufValue> {
        self.metadata
            .get(key)
            .with_context(|| format!("missing metadata key `{key}` in {}", self.path.display()))
    }

    fn type_error(&self, key: &str, want: &str) -> anyhow::Error {
        anyhow::anyhow!(
            "metadata key `{key}` in {} is not {want}: {:?}",
            self.path.display(),
            self.metadata.get(key)
        )
    }

    pub fn get_usize(&self, key: &str) -> anyhow::Result<usize> {
        self.get(key)?
            .as_i64()
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| self.type_error(key, "a non-negative integer"))
    }

    pub fn get_f64(&self, key: &str) -> anyhow::Result<f64> {
        self.get(key)?
            .as_f64()
            .ok_or_else(|| self.type_error(key, "a number"))
    }

    pub fn get_str(&self, key: &str) -> anyhow::Result<&str> {
        self.get(key)?
            .as_str()
            .ok_or_else(|| self.type_error(key, "a string"))
    }

    /// An optional metadata value: `Ok(None)` when absent, an error when of the wrong type.
    pub fn opt<T>(
        &self,
        key: &str,
        read: impl Fn(&Self, &str) -> anyhow::Result<T>,
    ) -> anyhow::Result<Option<T>> {
        if self.metadata.contains_key(key) {
            read(self, key).map(Some)
        } else {
            Ok(None)
        }
    }

    /// An array of strings (e.g. `tokenizer.ggml.tokens`).
    pub fn get_str_array(&self, key: &str) -> anyhow::Result<Vec<&str>> {
        self.get_array(key, "an array of strings", GgufValue::as_str)
    }

    /// An array of integers (e.g. `tokenizer.ggml.token_type`).
    pub fn get_int_array(&self, key: &str) -> anyhow::Result<Vec<i64>> {
        self.get_array(key, "an array of integers", GgufValue::as_i64)
    }

    /// An array of numbers (e.g. `tokenizer.ggml.scores`).
    pub fn get_float_array(&self, key: &str) -> anyhow::Result<Vec<f64>> {
        self.get_array(key, "an array of numbers", GgufValue::as_f64)
    }

    /// An array whose every item `item` converts; `what` names the expected type in errors.
    fn get_array<'a, T>(
        &'a self,
        key: &str,
        what: &str,
        item: impl Fn(&'a GgufValue) -> Option<T>,
    ) -> anyhow::Result<Vec<T>> {
        match self.get(key)? {
            GgufValue::Array(items) => items
                .iter()
                .map(|v| item(v).ok_or_else(|| self.type_error(key, what)))
                .collect(),
            _ => Err(self.type_error(key, what)),
        }
    }

    /// Reads a tensor by GGUF name in its GGUF layout (HF shape order, no
    /// un-permutation); quantised types keep their blocks.
    pub fn read_tensor(&self, gguf_name: &str) -> anyhow::Result<HostTensor> {
        let info = self
            .tensors
            .get(gguf_name)
            .with_context(|| format!("missing tensor `{gguf_name}` in {}", self.path.display()))?;
        let bytes = &self.mmap[info.offset..info.offset + info.n_bytes];
        let data = match info.dtype {
            GgmlType::F32 => decode_le_bytes(bytes, ElementType::F32),
            GgmlType::F16 => decode_le_bytes(bytes, ElementType::F16),
            GgmlType::BF16 => decode_le_bytes(bytes, ElementType::BF16),
            GgmlType::Quant(quant) => TensorData::Quant(quant, bytes.to_vec()),
        };
        Ok(HostTensor {
            shape: info.shape.clone(),
            data,
        })
    }
}
