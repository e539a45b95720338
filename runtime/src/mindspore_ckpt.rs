//! MindSpore's `.ckpt` checkpoints (`mindspore.save_checkpoint` / `load_checkpoint`): read
//! into named whole tensors and written back, so a user can start from a checkpoint trained
//! with MindSpore and go back to it.
//!
//! The file is one protobuf message of MindSpore's `checkpoint.proto` (proto2):
//!
//! ```text
//! message Checkpoint  { message Value { required string tag = 1; required TensorProto tensor = 2; }
//!                       repeated Value value = 1; }
//! message TensorProto { repeated int64 dims = 1; required string tensor_type = 2;
//!                       required bytes tensor_content = 3; }
//! ```
//!
//! `tag` is the parameter's name, `tensor_type` MindSpore's type name (`Float32`, `Int32`,
//! ...), `tensor_content` the elements, little-endian, in C order. MindSpore writes a large
//! tensor as several values of the same tag whose contents follow each other; they are
//! joined. Values that are not tensors (`tensor_type` `str`: the strings of `append_dict`)
//! are skipped. The messages are declared here with `prost`'s derive, field for field.
//!
//! Element types: `Float16`, `Float32`, `Float64`, `BFloat16`, `Int32`, `Int64`, `Bool`
//! read as themselves; `Int8`, `UInt8`, `Int16`, `UInt16` widen to Int32 and `UInt32` to
//! Int64 (shardc has no narrower integers); anything else is an error naming the tag and
//! the type. A truncated or otherwise malformed message is an error naming the file.

use crate::checkpoint::{write_atomic, CheckpointError};
use crate::tensor::{Data, Tensor};
use half::{bf16, f16};
use prost::Message;

use std::path::Path;

/// `checkpoint.proto`'s `Checkpoint`.
#[derive(Clone, PartialEq, Message)]
pub struct CheckpointProto {
    /// The values, in the file's order.
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<ValueProto>,
}

/// `Checkpoint.Value`: one parameter (or one piece of it).
#[derive(Clone, PartialEq, Message)]
pub struct ValueProto {
    /// The parameter's name.
    #[prost(string, required, tag = "1")]
    pub tag: String,
    /// Its value.
    #[prost(message, required, tag = "2")]
    pub tensor: TensorProto,
}

/// `TensorProto`.
#[derive(Clone, PartialEq, Message)]
pub struct TensorProto {
    /// The shape.
    #[prost(int64, repeated, packed = "false", tag = "1")]
    pub dims: Vec<i64>,
    /// MindSpore's type name.
    #[prost(string, required, tag = "2")]
    pub tensor_type: String,
    /// The elements, little-endian, C order.
    #[prost(bytes = "vec", required, tag = "3")]
    pub tensor_content: Vec<u8>,
}

fn corrupt(path: &Path, reason: impl Into<String>) -> CheckpointError {
    CheckpointError::Corrupt {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// The tensor of `dims` and `bytes` of MindSpore type `ty`; `Err` says what is wrong.
fn tensor_of(ty: &str, dims: &[usize], bytes: &[u8]) -> Result<Tensor, String> {
    let n: usize = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| format!("shape {dims:?} overflows"))?;
    let width = match ty {
        "Float64" | "Int64" => 8,
        "Float32" | "Int32" | "UInt32" => 4,
        "Float16" | "BFloat16" | "Int16" | "UInt16" => 2,
        "Bool" | "Int8" | "UInt8" => 1,
        other => {
            return Err(format!(
                "type {other} is not one shardc reads (Float16/32/64, BFloat16, Int8/16/32/64, UInt8/16/32, Bool)"
            ))
        }
    };
    if n.checked_mul(width) != Some(bytes.len()) {
        return Err(format!(
            "{} bytes of content for shape {dims:?} of {ty} ({} expected)",
            bytes.len(),
            n.saturating_mul(width)
        ));
    }
    let c = |i: usize| &bytes[i * width..(i + 1) * width];
    let u16_at = |i: usize| u16::from_le_bytes([c(i)[0], c(i)[1]]);
    let u32_at = |i: usize| u32::from_le_bytes([c(i)[0], c(i)[1], c(i)[2], c(i)[3]]);
    let u64_at = |i: usize| {
        let mut a = [0u8; 8];
        a.copy_from_slice(c(i));
        u64::from_le_bytes(a)
    };
    let data = match ty {
        "Float32" => Data::F32((0..n).map(|i| f32::from_bits(u32_at(i))).collect()),
        "Float64" => Data::F64((0..n).map(|i| f64::from_bits(u64_at(i))).collect()),
        "Float16" => Data::F16((0..n).map(|i| f16::from_bits(u16_at(i))).collect()),
        "BFloat16" => Data::BF16((0..n).map(|i| bf16::from_bits(u16_at(i))).collect()),
        "Int32" => Data::I32((0..n).map(|i| u32_at(i) as i32).collect()),
        "Int64" => Data::I64((0..n).map(|i| u64_at(i) as i64).collect()),
        "UInt32" => Data::I64((0..n).map(|i| u32_at(i) as i64).collect()),
        "Int16" => Data::I32((0..n).map(|i| u16_at(i) as i16 as i32).collect()),
        "UInt16" => Data::I32((0..n).map(|i| u16_at(i) as i32).collect()),
        "Int8" => Data::I32(bytes.iter().map(|&b| b as i8 as i32).collect()),
        "UInt8" => Data::I32(bytes.iter().map(|&b| b as i32).collect()),
        _ => {
            let mut v = Vec::with_capacity(n);
            for (i, &b) in bytes.iter().enumerate() {
                v.push(match b {
                    0 => false,
                    1 => true,
                    _ => return Err(format!("bool element {i} is byte {b}, not 0 or 1")),
                });
            }
            Data::Bool(v)
        }
    };
    Ok(Tensor {
        shape: dims.to_vec(),
        data,
    })
}

/// The tensors of a `.ckpt` file's bytes (`path` names it in errors), by tag, in the file's
/// order; the pieces of a tag are joined.
pub fn decode(bytes: &[u8], path: &Path) -> Result<Vec<(String, Tensor)>, CheckpointError> {
    let msg = CheckpointProto::decode(bytes).map_err(|e| {
        corrupt(
            path,
            format!("not a MindSpore checkpoint (checkpoint.proto): {e}"),
        )
    })?;
    // Per tag: its type, shape and content so far (pieces appended).
    let mut order: Vec<String> = Vec::new();
    let mut parts: std::collections::HashMap<String, (String, Vec<i64>, Vec<u8>)> =
        std::collections::HashMap::new();
    for v in msg.value {
        let t = v.tensor;
        if t.tensor_type == "str" {
            continue;
        }
        match parts.get_mut(&v.tag) {
            Some((ty, dims, content)) => {
                if *ty != t.tensor_type {
                    return Err(corrupt(
                        path,
                        format!(
                            "parameter {}: its pieces have types {ty} and {}",
                            v.tag, t.tensor_type
                        ),
                    ));
                }
                // A later piece continues the content; its dims are the whole's too.
                if dims.is_empty() {
                    *dims = t.dims;
                }
                content.extend_from_slice(&t.tensor_content);
            }
            None => {
                order.push(v.tag.clone());
                parts.insert(v.tag, (t.tensor_type, t.dims, t.tensor_content));
            }
        }
    }
    let mut out = Vec::with_capacity(order.len());
    for tag in order {
        let Some((ty, dims, content)) = parts.remove(&tag) else {
            continue;
        };
        let dims: Vec<usize> = dims
            .iter()
            .map(|&d| usize::try_from(d))
            .collect::<Result<_, _>>()
            .map_err(|_| {
                corrupt(
                    path,
                    format!("parameter {tag}: negative dimension in {dims:?}"),
                )
            })?;
        let t = tensor_of(&ty, &dims, &content)
            .map_err(|reason| corrupt(path, format!("parameter {tag}: {reason}")))?;
        out.push((tag, t));
    }
    Ok(out)
}

/// Reads a `.ckpt` file.
pub fn read(path: &Path) -> Result<Vec<(String, Tensor)>, CheckpointError> {
    let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    decode(&bytes, path)
}

/// The bytes of a `.ckpt` file holding `tensors` (one value per tensor, in order).
pub fn encode(tensors: &[(String, Tensor)]) -> Vec<u8> {
    let value = tensors
        .iter()
        .map(|(name, t)| ValueProto {
            tag: name.clone(),
            tensor: TensorProto {
                dims: t.shape.iter().map(|&d| d as i64).collect(),
                tensor_type: t.dtype().name().to_string(),
                tensor_content: t.to_le_bytes(),
            },
        })
        .collect();
    CheckpointProto { value }.encode_to_vec()
}

/// Writes `tensors` as a `.ckpt` file (atomically: a temporary file renamed).
pub fn write(path: &Path, tensors: &[(String, Tensor)]) -> Result<(), CheckpointError> {
    write_atomic(path, &encode(tensors))
}

/// The tensors of a safetensors file's bytes, sorted by name (narrow integers widened as in
/// `.ckpt`); `Err` says what is wrong.
pub fn safetensors_tensors(bytes: &[u8]) -> Result<Vec<(String, Tensor)>, String> {
    let st = safetensors::SafeTensors::deserialize(bytes)
        .map_err(|e| format!("not a safetensors file: {e}"))?;
    let mut names: Vec<String> = st.names().into_iter().map(String::from).collect();
    names.sort();
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        let v = st.tensor(&name).map_err(|e| format!("{name}: {e}"))?;
        use safetensors::Dtype as D;
        let ty = match v.dtype() {
            D::F32 => "Float32",
            D::F64 => "Float64",
            D::F16 => "Float16",
            D::BF16 => "BFloat16",
            D::I32 => "Int32",
            D::I64 => "Int64",
            D::BOOL => "Bool",
            D::I8 => "Int8",
            D::U8 => "UInt8",
            D::I16 => "Int16",
            D::U16 => "UInt16",
            D::U32 => "UInt32",
            other => {
                return Err(format!(
                    "{name}: element type {other:?} is not one shardc reads"
                ))
            }
        };
        let t = tensor_of(ty, v.shape(), v.data()).map_err(|r| format!("{name}: {r}"))?;
        out.push((name, t));
    }
    Ok(out)
}

/// The whole tensors of a weights file, by its extension: MindSpore's `.ckpt`, or
/// `.safetensors` (a shardc checkpoint, merged or of one device, or any safetensors file).
pub fn read_weights(path: &Path) -> Result<Vec<(String, Tensor)>, CheckpointError> {
    match path.extension().and_then(|e| e.to_str()) {
        Some("ckpt") => read(path),
        Some("safetensors") => {
            let bytes = std::fs::read(path).map_err(|source| CheckpointError::Io {
                path: path.to_path_buf(),
                source,
            })?;
            safetensors_tensors(&bytes).map_err(|reason| corrupt(path, reason))
        }
        _ => Err(corrupt(
            path,
            "a weights file must be MindSpore's .ckpt or .safetensors",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<(String, Tensor)> {
        vec![
            (
                "fc1.weight".into(),
                Tensor::from_f32(vec![2, 3], vec![1.0, -2.0, 3.5, 0.0, 1e-8, 7.0]).unwrap(),
            ),
            (
                "global_step".into(),
                Tensor::from_i32(vec![1], vec![12]).unwrap(),
            ),
            ("flag".into(), Tensor::from_f64(vec![], vec![0.25]).unwrap()),
        ]
    }

    #[test]
    fn a_checkpoint_round_trips() {
        let p = Path::new("x.ckpt");
        assert_eq!(decode(&encode(&sample()), p).unwrap(), sample());
    }

    #[test]
    fn pieces_of_a_tag_are_joined_and_strings_skipped() {
        let piece = |content: &[f32], dims: Vec<i64>| ValueProto {
            tag: "big".into(),
            tensor: TensorProto {
                dims,
                tensor_type: "Float32".into(),
                tensor_content: content.iter().flat_map(|x| x.to_le_bytes()).collect(),
            },
        };
        let msg = CheckpointProto {
            value: vec![
                piece(&[1.0, 2.0], vec![2, 2]),
                ValueProto {
                    tag: "note".into(),
                    tensor: TensorProto {
                        dims: vec![],
                        tensor_type: "str".into(),
                        tensor_content: b"hello".to_vec(),
                    },
                },
                piece(&[3.0, 4.0], vec![2, 2]),
            ],
        };
        let t = decode(&msg.encode_to_vec(), Path::new("p.ckpt")).unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(
            t[0].1,
            Tensor::from_f32(vec![2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap()
        );
    }

    #[test]
    fn malformed_files_are_errors_naming_the_file_and_the_fault() {
        let good = encode(&sample());
        let p = Path::new("bad.ckpt");
        let e = decode(&good[..good.len() - 5], p).unwrap_err().to_string();
        assert!(
            e.contains("bad.ckpt") && e.contains("checkpoint.proto"),
            "{e}"
        );
        let mut wrong = CheckpointProto::decode(good.as_slice()).unwrap();
        wrong.value[0].tensor.tensor_type = "Complex64".into();
        let e = decode(&wrong.encode_to_vec(), p).unwrap_err().to_string();
        assert!(e.contains("fc1.weight") && e.contains("Complex64"), "{e}");
        let mut short = CheckpointProto::decode(good.as_slice()).unwrap();
        short.value[0].tensor.dims = vec![3, 3];
        let e = decode(&short.encode_to_vec(), p).unwrap_err().to_string();
        assert!(e.contains("24 bytes") && e.contains("[3, 3]"), "{e}");
    }

    proptest::proptest! {
        /// Any bytes decode to tensors or to an error; never a panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = decode(&bytes, Path::new("fuzz.ckpt"));
        }

        /// Any truncation or byte flip of a real file decodes or fails cleanly.
        #[test]
        fn damaged_checkpoints_never_panic(cut in 0usize..200, flip in 0usize..200, bit in 0u8..8) {
            let mut b = encode(&sample());
            if flip < b.len() {
                b[flip] ^= 1 << bit;
            }
            b.truncate(cut.min(b.len()));
            let _ = decode(&b, Path::new("fuzz.ckpt"));
        }
    }
}
