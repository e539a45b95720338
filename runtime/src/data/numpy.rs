//! NumPy arrays as data: `.npy` and `.npz` files (NumPy's own format, versions 1.0 to 3.0)
//! and safetensors files read as named tensors ([`read_arrays`]), and MindSpore's
//! `NumpySlicesDataset` over them (one column per array, a row per index of dimension 0).
//!
//! An `.npy` file is the magic `\x93NUMPY`, a version, a header length (2 bytes in 1.0, 4 in
//! 2.0 and 3.0) and a Python dict literal (`{'descr': '<f4', 'fortran_order': False,
//! 'shape': (3, 4), }`), then the elements. An `.npz` file is a zip archive of `.npy` files
//! (`np.savez` stores them, `np.savez_compressed` deflates them), each array named by its
//! entry without `.npy`.
//!
//! Element types: `f2`, `f4`, `f8`, `i4`, `i8` and `b1` read as Float16, Float32, Float64,
//! Int32, Int64 and Bool; the narrower integers `i1`, `u1`, `i2`, `u2` widen to Int32 and
//! `u4` to Int64 (shardc has no 8- or 16-bit integer type; images are often `uint8`); `u8`
//! reads as Int64 when every element fits. Either byte order reads; Fortran order is
//! rearranged to C order. Anything else (complex, strings, objects, structured types) is an
//! error naming the file, the array and the type.

use super::dataset::Dataset;
use super::source::{Source, SourceOptions};
use super::DataError;
use crate::tensor::{Data, Tensor};
use half::f16;
use shardc_ir::{DType, TensorType};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;

const MAGIC: &[u8] = b"\x93NUMPY";

fn format_err(path: &str, reason: impl Into<String>) -> DataError {
    DataError::Format {
        path: path.to_string(),
        reason: reason.into(),
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, DataError> {
    std::fs::read(path).map_err(|source| DataError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// One element type of a `descr`: its kind (`f`, `i`, `u`, `b`), byte width and whether its
/// bytes are big-endian.
#[derive(Clone, Copy, Debug)]
struct Descr {
    kind: char,
    width: usize,
    big_endian: bool,
}

fn parse_descr(descr: &str, what: &str) -> Result<Descr, DataError> {
    let bad = || {
        format_err(
            what,
            format!(
                "element type '{descr}' is not one shardc reads (f2, f4, f8, i1, i2, i4, i8, u1, u2, u4, u8, b1)"
            ),
        )
    };
    let mut chars = descr.chars();
    let order = chars.next().ok_or_else(bad)?;
    let big_endian = match order {
        '<' | '|' | '=' => false,
        '>' => true,
        _ => return Err(bad()),
    };
    let kind = chars.next().ok_or_else(bad)?;
    let width: usize = chars.as_str().parse().map_err(|_| bad())?;
    let ok = matches!(
        (kind, width),
        ('f', 2 | 4 | 8) | ('i', 1 | 2 | 4 | 8) | ('u', 1 | 2 | 4 | 8) | ('b', 1)
    );
    if !ok {
        return Err(bad());
    }
    Ok(Descr {
        kind,
        width,
        big_endian,
    })
}

/// The value of `key` in the header dict (the text after `'key':` up to the next top-level
/// comma or the closing brace).
fn dict_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let at = header.find(&format!("'{key}'"))?;
    let rest = &header[at + key.len() + 2..];
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    let mut depth = 0i32;
    for (i, c) in rest.char_indices() {
        match c {
            '(' | '[' | '{' => depth += 1,
            ')' | ']' => depth -= 1,
            '}' if depth == 0 => return Some(rest[..i].trim()),
            '}' => depth -= 1,
            ',' if depth == 0 => return Some(rest[..i].trim()),
            _ => {}
        }
    }
    None
}

fn parse_shape(text: &str, what: &str) -> Result<Vec<usize>, DataError> {
    let inner = text
        .strip_prefix('(')
        .and_then(|t| t.strip_suffix(')'))
        .ok_or_else(|| format_err(what, format!("shape {text} is not a tuple")))?;
    inner
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.trim_end_matches('L')
                .parse::<usize>()
                .map_err(|_| format_err(what, format!("shape {text}: {s} is not a size")))
        })
        .collect()
}

/// The tensor an `.npy` file's bytes hold; `what` names it in errors (the file, and the
/// array within an `.npz`).
pub fn parse_npy(bytes: &[u8], what: &str) -> Result<Tensor, DataError> {
    if !bytes.starts_with(MAGIC) {
        return Err(format_err(
            what,
            "not an .npy array (no \\x93NUMPY magic at its start)",
        ));
    }
    let short = || format_err(what, "the file ends inside its header");
    let major = *bytes.get(6).ok_or_else(short)?;
    let (len, start) = match major {
        1 => {
            let b = bytes.get(8..10).ok_or_else(short)?;
            (u16::from_le_bytes([b[0], b[1]]) as usize, 10)
        }
        2 | 3 => {
            let b = bytes.get(8..12).ok_or_else(short)?;
            (u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize, 12)
        }
        v => {
            return Err(format_err(
                what,
                format!("format version {v} is not 1, 2 or 3"),
            ))
        }
    };
    let header = bytes.get(start..start + len).ok_or_else(short)?;
    let header =
        std::str::from_utf8(header).map_err(|_| format_err(what, "the header is not text"))?;
    let field = |key: &str| {
        dict_value(header, key)
            .ok_or_else(|| format_err(what, format!("the header {header:?} has no '{key}'")))
    };
    let descr_text = field("descr")?;
    let descr_text = descr_text.trim_matches(|c| c == '\'' || c == '"');
    let descr = parse_descr(descr_text, what)?;
    let fortran = match field("fortran_order")? {
        "True" => true,
        "False" => false,
        other => {
            return Err(format_err(
                what,
                format!("fortran_order {other} is neither True nor False"),
            ))
        }
    };
    let shape = parse_shape(field("shape")?, what)?;
    let n = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| format_err(what, format!("shape {shape:?} overflows")))?;
    let body = &bytes[start + len..];
    let need = n
        .checked_mul(descr.width)
        .ok_or_else(|| format_err(what, format!("shape {shape:?} overflows")))?;
    if body.len() < need {
        return Err(format_err(
            what,
            format!(
                "shape {shape:?} of '{descr_text}' needs {need} bytes of data, the file has {}",
                body.len()
            ),
        ));
    }
    let t = decode(&body[..need], descr, &shape, descr_text, what)?;
    Ok(if fortran && shape.len() > 1 {
        c_order(&t)
    } else {
        t
    })
}

/// The elements of `body` as a tensor of `shape`.
fn decode(
    body: &[u8],
    d: Descr,
    shape: &[usize],
    descr: &str,
    what: &str,
) -> Result<Tensor, DataError> {
    let w = d.width;
    // Each element's bytes in little-endian order.
    let le = |c: &[u8]| -> [u8; 8] {
        let mut a = [0u8; 8];
        for (k, &b) in c.iter().enumerate() {
            let at = if d.big_endian { w - 1 - k } else { k };
            a[at] = b;
        }
        a
    };
    let elems = body.chunks_exact(w);
    let data = match (d.kind, w) {
        ('f', 2) => Data::F16(
            elems
                .map(|c| f16::from_bits(u16::from_le_bytes([le(c)[0], le(c)[1]])))
                .collect(),
        ),
        ('f', 4) => Data::F32(
            elems
                .map(|c| {
                    let a = le(c);
                    f32::from_le_bytes([a[0], a[1], a[2], a[3]])
                })
                .collect(),
        ),
        ('f', 8) => Data::F64(elems.map(|c| f64::from_le_bytes(le(c))).collect()),
        ('i', 8) => Data::I64(elems.map(|c| i64::from_le_bytes(le(c))).collect()),
        ('u', 8) => {
            let v: Vec<u64> = elems.map(|c| u64::from_le_bytes(le(c))).collect();
            let mut out = Vec::with_capacity(v.len());
            for (i, x) in v.into_iter().enumerate() {
                out.push(i64::try_from(x).map_err(|_| {
                    format_err(
                        what,
                        format!(
                            "'{descr}' element {i} is {x}, beyond Int64 (shardc's widest integer)"
                        ),
                    )
                })?);
            }
            Data::I64(out)
        }
        ('u', 4) => Data::I64(
            elems
                .map(|c| {
                    let a = le(c);
                    u32::from_le_bytes([a[0], a[1], a[2], a[3]]) as i64
                })
                .collect(),
        ),
        ('i', 4) => Data::I32(
            elems
                .map(|c| {
                    let a = le(c);
                    i32::from_le_bytes([a[0], a[1], a[2], a[3]])
                })
                .collect(),
        ),
        ('i', 2) => Data::I32(
            elems
                .map(|c| {
                    let a = le(c);
                    i16::from_le_bytes([a[0], a[1]]) as i32
                })
                .collect(),
        ),
        ('u', 2) => Data::I32(
            elems
                .map(|c| {
                    let a = le(c);
                    u16::from_le_bytes([a[0], a[1]]) as i32
                })
                .collect(),
        ),
        ('i', 1) => Data::I32(elems.map(|c| c[0] as i8 as i32).collect()),
        ('u', 1) => Data::I32(elems.map(|c| c[0] as i32).collect()),
        ('b', 1) => {
            let mut out = Vec::with_capacity(body.len());
            for (i, &b) in body.iter().enumerate() {
                out.push(match b {
                    0 => false,
                    1 => true,
                    _ => {
                        return Err(format_err(
                            what,
                            format!("bool element {i} is byte {b}, not 0 or 1"),
                        ))
                    }
                });
            }
            Data::Bool(out)
        }
        _ => {
            return Err(format_err(
                what,
                format!("element type '{descr}' is not one shardc reads"),
            ))
        }
    };
    Ok(Tensor {
        shape: shape.to_vec(),
        data,
    })
}

/// `t`, whose elements are in Fortran (column-major) order, with its elements in C order.
fn c_order(t: &Tensor) -> Tensor {
    let shape = &t.shape;
    let n: usize = shape.iter().product();
    // Column-major strides.
    let mut fstride = vec![1usize; shape.len()];
    for k in 1..shape.len() {
        fstride[k] = fstride[k - 1] * shape[k - 1];
    }
    let mut out = Tensor::zeros(&TensorType::new(t.dtype(), shape.clone()));
    let mut idx = vec![0usize; shape.len()];
    for c in 0..n {
        let f: usize = idx.iter().zip(&fstride).map(|(i, s)| i * s).sum();
        out.copy_elements(c, t, f, 1);
        // Next C-order index.
        for k in (0..shape.len()).rev() {
            idx[k] += 1;
            if idx[k] < shape[k] {
                break;
            }
            idx[k] = 0;
        }
    }
    out
}

/// The bytes of `t` as an `.npy` file (version 1.0, C order, little-endian); BFloat16, which
/// NumPy has no type for, is an error.
pub fn npy_bytes(t: &Tensor) -> Result<Vec<u8>, DataError> {
    let descr = match t.dtype() {
        DType::Float16 => "<f2",
        DType::Float32 => "<f4",
        DType::Float64 => "<f8",
        DType::Int32 => "<i4",
        DType::Int64 => "<i8",
        DType::Bool => "|b1",
        DType::BFloat16 => {
            return Err(DataError::Mismatch(
                "a BFloat16 tensor has no NumPy element type: cast it to Float32 first".into(),
            ))
        }
    };
    let shape = match t.shape.len() {
        0 => "()".to_string(),
        1 => format!("({},)", t.shape[0]),
        _ => format!(
            "({})",
            t.shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // Magic, version and length (10 bytes) plus the header end on a multiple of 64.
    let total = (10 + header.len() + 1).div_ceil(64) * 64;
    while 10 + header.len() + 1 < total {
        header.push(' ');
    }
    header.push('\n');
    let mut out = Vec::with_capacity(total + t.size_bytes());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(&t.to_le_bytes());
    Ok(out)
}

/// Reads an `.npy` file.
pub fn read_npy(path: &Path) -> Result<Tensor, DataError> {
    parse_npy(&read_file(path)?, &path.display().to_string())
}

/// Reads an `.npz` file: its arrays, named by their entries (without `.npy`), in the
/// archive's order.
pub fn read_npz(path: &Path) -> Result<Vec<(String, Tensor)>, DataError> {
    let shown = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|source| DataError::Io {
        path: shown.clone(),
        source,
    })?;
    let mut zip = zip::ZipArchive::new(file)
        .map_err(|e| format_err(&shown, format!("not an .npz (zip) archive: {e}")))?;
    let mut out = Vec::with_capacity(zip.len());
    for i in 0..zip.len() {
        let mut entry = zip
            .by_index(i)
            .map_err(|e| format_err(&shown, format!("entry {i}: {e}")))?;
        let name = entry.name().to_string();
        let Some(array) = name.strip_suffix(".npy") else {
            return Err(format_err(
                &shown,
                format!("entry {name:?} is not an .npy array"),
            ));
        };
        let mut bytes = Vec::new();
        entry
            .read_to_end(&mut bytes)
            .map_err(|e| format_err(&shown, format!("entry {name:?}: {e}")))?;
        let t = parse_npy(&bytes, &format!("{shown}[{array}]"))?;
        out.push((array.to_string(), t));
    }
    Ok(out)
}

/// Writes `arrays` as an `.npz` file (stored, as `np.savez`).
pub fn write_npz(path: &Path, arrays: &[(&str, &Tensor)]) -> Result<(), DataError> {
    let shown = path.display().to_string();
    let file = std::fs::File::create(path).map_err(|source| DataError::Io {
        path: shown.clone(),
        source,
    })?;
    let mut zip = zip::ZipWriter::new(file);
    let opts =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, t) in arrays {
        let bytes = npy_bytes(t)?;
        zip.start_file(format!("{name}.npy"), opts)
            .and_then(|_| zip.write_all(&bytes).map_err(Into::into))
            .map_err(|e| format_err(&shown, format!("writing {name}: {e}")))?;
    }
    zip.finish()
        .map_err(|e| format_err(&shown, format!("finishing the archive: {e}")))?;
    Ok(())
}

/// Reads a safetensors file's tensors, by name (sorted; narrow integers widened).
pub fn read_safetensors(path: &Path) -> Result<Vec<(String, Tensor)>, DataError> {
    crate::mindspore_ckpt::safetensors_tensors(&read_file(path)?)
        .map_err(|reason| format_err(&path.display().to_string(), reason))
}

/// The named arrays of a data file, by its extension: `.npz` (every array), `.npy` (one
/// array, named by the file's stem), `.safetensors` (every tensor, sorted by name).
pub fn read_arrays(path: &Path) -> Result<Vec<(String, Tensor)>, DataError> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("npz") => read_npz(path),
        Some("npy") => {
            let stem = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or("array")
                .to_string();
            Ok(vec![(stem, read_npy(path)?)])
        }
        Some("safetensors") => read_safetensors(path),
        _ => Err(format_err(
            &path.display().to_string(),
            "a data file must be .npz, .npy or .safetensors",
        )),
    }
}

/// Row `i` of `t` (its slice at index `i` of dimension 0).
pub fn row(t: &Tensor, i: usize) -> Option<Tensor> {
    let (&n, rest) = t.shape.split_first()?;
    if i >= n {
        return None;
    }
    let per: usize = rest.iter().product();
    let mut out = Tensor::zeros(&TensorType::new(t.dtype(), rest.to_vec()));
    out.copy_elements(0, t, i * per, per).then_some(out)
}

/// The source of a [`NumpySlicesDataset`]: row `i` is every column's slice `i`.
struct SlicesSource {
    name: String,
    columns: Vec<String>,
    arrays: Vec<Tensor>,
    len: usize,
}

impl Source for SlicesSource {
    fn name(&self) -> &str {
        &self.name
    }
    fn len(&self) -> usize {
        self.len
    }
    fn columns(&self) -> &[String] {
        &self.columns
    }
    fn fetch(&self, index: usize) -> Result<Vec<Tensor>, DataError> {
        self.arrays
            .iter()
            .zip(&self.columns)
            .map(|(a, c)| {
                row(a, index).ok_or_else(|| {
                    DataError::Pipeline(format!(
                        "{}: column {c} has no row {index} (shape {:?})",
                        self.name, a.shape
                    ))
                })
            })
            .collect()
    }
}

/// MindSpore's `NumpySlicesDataset`: one column per array, row `i` the arrays' slices at
/// index `i` of dimension 0 (every array has the same length there).
pub struct NumpySlicesDataset;

impl NumpySlicesDataset {
    /// A data set over `columns` (name, array), sampled by `opts`. Names must be distinct and
    /// non-empty; every array must have at least one dimension, all the same length in
    /// dimension 0.
    // MindSpore's shape: the class constructs a pipeline, not itself.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(columns: Vec<(String, Tensor)>, opts: SourceOptions) -> Result<Dataset, DataError> {
        let names: Vec<&str> = columns.iter().map(|(n, _)| n.as_str()).collect();
        let name = format!("NumpySlicesDataset({})", names.join(", "));
        if columns.is_empty() {
            return Err(DataError::Pipeline(format!("{name}: no columns")));
        }
        let mut len = None;
        for (i, (c, t)) in columns.iter().enumerate() {
            if c.is_empty() || names[..i].contains(&c.as_str()) {
                return Err(DataError::Pipeline(format!(
                    "{name}: column {i} ({c:?}) is empty or named twice"
                )));
            }
            let Some(&n) = t.shape.first() else {
                return Err(DataError::Pipeline(format!(
                    "{name}: column {c} is a scalar; each column needs a first dimension of samples"
                )));
            };
            match len {
                None => len = Some(n),
                Some(m) if m != n => {
                    return Err(DataError::Pipeline(format!(
                        "{name}: column {c} has {n} samples (shape {:?}) but {} has {m}",
                        t.shape, columns[0].0
                    )))
                }
                Some(_) => {}
            }
        }
        opts.validate(&name)?;
        let (columns, arrays) = columns.into_iter().unzip();
        let src = SlicesSource {
            name,
            columns,
            arrays,
            len: len.unwrap_or(0),
        };
        Ok(Dataset::from_source(Arc::new(src), opts))
    }

    /// A data set over the arrays of a data file ([`read_arrays`]: `.npz`, `.npy`,
    /// `.safetensors`); with `column_names`, only those arrays, in that order (a missing
    /// one is an error listing the file's).
    pub fn from_file(
        path: &Path,
        column_names: Option<&[&str]>,
        opts: SourceOptions,
    ) -> Result<Dataset, DataError> {
        let mut arrays = read_arrays(path)?;
        let columns = match column_names {
            None => arrays,
            Some(want) => {
                let mut picked = Vec::with_capacity(want.len());
                for w in want {
                    let Some(k) = arrays.iter().position(|(n, _)| n == w) else {
                        let have: Vec<&str> = arrays.iter().map(|(n, _)| n.as_str()).collect();
                        return Err(format_err(
                            &path.display().to_string(),
                            format!("has no array {w:?} (it has {have:?})"),
                        ));
                    };
                    picked.push(arrays.swap_remove(k));
                }
                picked
            }
        };
        NumpySlicesDataset::new(columns, opts)
    }
}

/// Global batches of a graph's data inputs cut from named arrays (`shardc run --data`): every
/// data input takes the array of its name, whose first dimension is the sample and whose
/// other dimensions and element type are the input's; batch `k` is samples `[k·B, (k+1)·B)`
/// of every array (`B` the inputs' batch dimension), the last partial batch dropped, and the
/// batches cycle (a pass over the file is [`ArrayBatches::len`] steps).
#[derive(Clone, Debug)]
pub struct ArrayBatches {
    names: Vec<String>,
    arrays: Vec<Tensor>,
    batch: usize,
    count: usize,
    samples: usize,
}

impl ArrayBatches {
    /// The batches of `graph`'s data inputs (with their global shapes) from `arrays`; `what`
    /// names the file in errors: an input without an array (listing the file's), an array of
    /// another element type or sample shape, fewer samples than one batch.
    pub fn new(
        graph: &shardc_ir::Graph,
        mut arrays: Vec<(String, Tensor)>,
        what: &str,
    ) -> Result<ArrayBatches, DataError> {
        let have: Vec<String> = arrays.iter().map(|(n, _)| n.clone()).collect();
        let mut names = Vec::new();
        let mut picked = Vec::new();
        let mut batch = None;
        let mut samples: Option<(usize, String)> = None;
        for p in graph
            .params
            .iter()
            .filter(|p| p.kind == shardc_ir::ParamKind::Input)
        {
            let Some(k) = arrays.iter().position(|(n, _)| n == &p.name) else {
                return Err(format_err(
                    what,
                    format!(
                        "has no array for the model's input {:?} {} (it has {have:?}); name each array after its input",
                        p.name, p.ty
                    ),
                ));
            };
            let (_, t) = arrays.swap_remove(k);
            let Some((&b, sample)) = p.ty.shape.split_first() else {
                return Err(DataError::Mismatch(format!(
                    "the model's input {:?} {} is a scalar: a data file feeds inputs whose first dimension is the batch",
                    p.name, p.ty
                )));
            };
            let ok = t.dtype() == p.ty.dtype && t.shape.get(1..) == Some(sample);
            if !ok {
                return Err(format_err(
                    what,
                    format!(
                        "array {:?} is {} {:?}, but the model's input takes {} samples of shape {sample:?} (input {})",
                        p.name,
                        t.dtype().name(),
                        t.shape,
                        p.ty.dtype.name(),
                        p.ty
                    ),
                ));
            }
            let n = t.shape[0];
            match &samples {
                Some((m, first)) if *m != n => {
                    return Err(format_err(
                        what,
                        format!("array {:?} has {n} samples but {first:?} has {m}", p.name),
                    ))
                }
                _ => samples = Some((n, p.name.clone())),
            }
            match batch {
                Some(c) if c != b => {
                    return Err(DataError::Mismatch(format!(
                        "the model's inputs disagree on the batch: {} for {:?}, {c} before",
                        b, p.name
                    )))
                }
                _ => batch = Some(b),
            }
            names.push(p.name.clone());
            picked.push(t);
        }
        let (Some(batch), Some((n, _))) = (batch, samples) else {
            return Err(DataError::Mismatch(
                "the model has no data input to feed from a file".into(),
            ));
        };
        let count = n / batch.max(1);
        if count == 0 {
            return Err(format_err(
                what,
                format!("has {n} samples, fewer than one batch of {batch}"),
            ));
        }
        Ok(ArrayBatches {
            names,
            arrays: picked,
            batch,
            count,
            samples: n,
        })
    }

    /// Full batches in one pass over the arrays.
    pub fn len(&self) -> usize {
        self.count
    }

    /// The samples of the file (those of the last partial batch included).
    pub fn samples(&self) -> usize {
        self.samples
    }

    /// The batch size (the inputs' dimension 0).
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Whether there is no batch (never: [`ArrayBatches::new`] refuses that).
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Step `step`'s global batch: batch `step mod len` of every input, by name.
    pub fn feeds(&self, step: u64) -> Vec<(&str, Tensor)> {
        let k = (step % self.count as u64) as usize;
        self.names
            .iter()
            .zip(&self.arrays)
            .map(|(name, a)| {
                let per: usize = a.shape[1..].iter().product();
                let mut shape = a.shape.clone();
                shape[0] = self.batch;
                let mut t = Tensor::zeros(&TensorType::new(a.dtype(), shape));
                t.copy_elements(0, a, k * self.batch * per, self.batch * per);
                (name.as_str(), t)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_f32(shape.to_vec(), v.to_vec()).unwrap()
    }

    #[test]
    fn npy_round_trips_every_type_numpy_has() {
        let ts = [
            f32s(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.5]),
            f32s(&[], &[7.0]),
            Tensor::from_i64(vec![3], vec![-1, 0, 1 << 40]).unwrap(),
            Tensor::from_i32(vec![1, 2], vec![-5, 9]).unwrap(),
            Tensor::from_f64(vec![2], vec![0.25, -1e300]).unwrap(),
        ];
        for t in ts {
            let b = npy_bytes(&t).unwrap();
            // The header ends on a 64-byte boundary, as NumPy writes it.
            let hl = u16::from_le_bytes([b[8], b[9]]) as usize;
            assert_eq!((10 + hl) % 64, 0);
            let back = parse_npy(&b, "t.npy").unwrap();
            assert_eq!(back, t);
        }
    }

    /// Hand-written headers: big-endian, Fortran order, uint8 widening, version 2.
    #[test]
    fn numpys_other_layouts_read_as_c_order_little_endian() {
        let file = |version: u8, header: &str, body: &[u8]| {
            let mut b = MAGIC.to_vec();
            b.extend_from_slice(&[version, 0]);
            if version == 1 {
                b.extend_from_slice(&(header.len() as u16).to_le_bytes());
            } else {
                b.extend_from_slice(&(header.len() as u32).to_le_bytes());
            }
            b.extend_from_slice(header.as_bytes());
            b.extend_from_slice(body);
            b
        };
        // >i4 [2]: 1, 258.
        let be = file(
            1,
            "{'descr': '>i4', 'fortran_order': False, 'shape': (2,), }\n",
            &[0, 0, 0, 1, 0, 0, 1, 2],
        );
        assert_eq!(
            parse_npy(&be, "be").unwrap(),
            Tensor::from_i32(vec![2], vec![1, 258]).unwrap()
        );
        // Fortran order (2, 3): column-major 0..6 is C [[0, 2, 4], [1, 3, 5]].
        let body: Vec<u8> = (0..6u8).collect();
        let f = file(
            2,
            "{'descr': '|u1', 'fortran_order': True, 'shape': (2, 3), }\n",
            &body,
        );
        assert_eq!(
            parse_npy(&f, "f").unwrap(),
            Tensor::from_i32(vec![2, 3], vec![0, 2, 4, 1, 3, 5]).unwrap()
        );
    }

    #[test]
    fn bad_npy_files_are_errors_naming_what_is_wrong() {
        let good = npy_bytes(&f32s(&[4], &[1.0, 2.0, 3.0, 4.0])).unwrap();
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (b"PK\x03\x04".to_vec(), "magic"),
            (good[..8].to_vec(), "ends inside its header"),
            (good[..good.len() - 3].to_vec(), "needs 16 bytes of data"),
            (
                {
                    let mut b = good.clone();
                    let h = String::from_utf8_lossy(&b[10..70]).replace("<f4", "<c8");
                    b[10..70].copy_from_slice(h.as_bytes());
                    b
                },
                "element type '<c8'",
            ),
        ];
        for (bytes, want) in cases {
            let e = parse_npy(&bytes, "x.npy").unwrap_err().to_string();
            assert!(e.contains("x.npy") && e.contains(want), "{want}: {e}");
        }
    }

    #[test]
    fn npz_and_slices_dataset_yield_rows_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.npz");
        let x = f32s(&[4, 2], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
        let y = Tensor::from_i32(vec![4], vec![10, 11, 12, 13]).unwrap();
        write_npz(&path, &[("x", &x), ("label", &y)]).unwrap();
        let arrays = read_npz(&path).unwrap();
        assert_eq!(arrays[0], ("x".to_string(), x.clone()));
        assert_eq!(arrays[1], ("label".to_string(), y.clone()));
        // Shard 1 of 2, batches of 1: rows 1 and 3.
        let opts = SourceOptions {
            num_shards: 2,
            shard_id: 1,
            ..Default::default()
        };
        let ds = NumpySlicesDataset::from_file(&path, Some(&["x", "label"]), opts)
            .unwrap()
            .batch(1, true)
            .unwrap();
        let rows: Vec<Vec<Tensor>> = ds.iter(0).unwrap().map(|b| b.unwrap()).collect();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0][0], f32s(&[1, 2], &[2.0, 3.0]));
        assert_eq!(rows[1][1], Tensor::from_i32(vec![1], vec![13]).unwrap());
        let e = NumpySlicesDataset::from_file(&path, Some(&["image"]), SourceOptions::default())
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("no array \"image\"") && e.contains("label"),
            "{e}"
        );
        let e = NumpySlicesDataset::new(
            vec![("a".into(), x), ("b".into(), f32s(&[3], &[1.0, 2.0, 3.0]))],
            SourceOptions::default(),
        )
        .err()
        .unwrap()
        .to_string();
        assert!(e.contains("3 samples") && e.contains("has 4"), "{e}");
    }
}
