//! Element types of tensors (aclDataType) and their conversion to and from the f32 / f64 /
//! i64 the reference code computes in.

use crate::bail;
use crate::diag::EmuResult;

/// An element type the emulator computes with. Values are aclDataType's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// ACL_FLOAT (0).
    F32,
    /// ACL_FLOAT16 (1).
    F16,
    /// ACL_INT8 (2).
    I8,
    /// ACL_INT32 (3).
    I32,
    /// ACL_UINT8 (4).
    U8,
    /// ACL_INT16 (6).
    I16,
    /// ACL_INT64 (9).
    I64,
    /// ACL_DOUBLE (11).
    F64,
    /// ACL_BOOL (12).
    Bool,
    /// ACL_BF16 (27).
    Bf16,
}

impl DType {
    /// The type of aclDataType value `v`, if the emulator supports it.
    pub fn from_acl(v: i32) -> Option<DType> {
        Some(match v {
            0 => DType::F32,
            1 => DType::F16,
            2 => DType::I8,
            3 => DType::I32,
            4 => DType::U8,
            6 => DType::I16,
            9 => DType::I64,
            11 => DType::F64,
            12 => DType::Bool,
            27 => DType::Bf16,
            _ => return None,
        })
    }

    /// `from_acl` as a result naming the API.
    pub fn parse(api: &str, v: i32) -> EmuResult<DType> {
        match DType::from_acl(v) {
            Some(d) => Ok(d),
            None => bail!(
                InvalidParam,
                "{api}: aclDataType {v} is not supported by the emulator"
            ),
        }
    }

    /// The aclDataType value.
    pub fn acl(self) -> i32 {
        match self {
            DType::F32 => 0,
            DType::F16 => 1,
            DType::I8 => 2,
            DType::I32 => 3,
            DType::U8 => 4,
            DType::I16 => 6,
            DType::I64 => 9,
            DType::F64 => 11,
            DType::Bool => 12,
            DType::Bf16 => 27,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::I8 | DType::U8 | DType::Bool => 1,
            DType::F16 | DType::Bf16 | DType::I16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::I64 | DType::F64 => 8,
        }
    }

    /// Whether it is a floating-point type.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::Bf16 | DType::F64)
    }

    /// Whether it is an integer type (bool excluded).
    pub fn is_int(self) -> bool {
        matches!(
            self,
            DType::I8 | DType::U8 | DType::I16 | DType::I32 | DType::I64
        )
    }

    /// Reads element `i` of `b` as f64.
    pub fn load(self, b: &[u8], i: usize) -> f64 {
        let o = i * self.size();
        match self {
            DType::F32 => f32::from_le_bytes(bytes(&b[o..o + 4])) as f64,
            DType::F64 => f64::from_le_bytes(bytes(&b[o..o + 8])),
            DType::F16 => f16_to_f32(u16::from_le_bytes([b[o], b[o + 1]])) as f64,
            DType::Bf16 => bf16_to_f32(u16::from_le_bytes([b[o], b[o + 1]])) as f64,
            DType::I8 => b[o] as i8 as f64,
            DType::U8 => b[o] as f64,
            DType::Bool => (b[o] != 0) as u8 as f64,
            DType::I16 => i16::from_le_bytes([b[o], b[o + 1]]) as f64,
            DType::I32 => i32::from_le_bytes(bytes(&b[o..o + 4])) as f64,
            DType::I64 => i64::from_le_bytes(bytes(&b[o..o + 8])) as f64,
        }
    }

    /// Reads element `i` of `b` as i64 (floats truncate toward zero).
    pub fn load_i64(self, b: &[u8], i: usize) -> i64 {
        let o = i * self.size();
        match self {
            DType::I64 => i64::from_le_bytes(bytes(&b[o..o + 8])),
            DType::I32 => i32::from_le_bytes(bytes(&b[o..o + 4])) as i64,
            _ => self.load(b, i) as i64,
        }
    }

    /// Writes `v` as element `i` of `b` (integers round toward zero and saturate, bool is
    /// `v != 0`).
    pub fn store(self, b: &mut [u8], i: usize, v: f64) {
        let o = i * self.size();
        match self {
            DType::F32 => b[o..o + 4].copy_from_slice(&(v as f32).to_le_bytes()),
            DType::F64 => b[o..o + 8].copy_from_slice(&v.to_le_bytes()),
            DType::F16 => b[o..o + 2].copy_from_slice(&f32_to_f16(v as f32).to_le_bytes()),
            DType::Bf16 => b[o..o + 2].copy_from_slice(&f32_to_bf16(v as f32).to_le_bytes()),
            DType::I8 => b[o] = v as i8 as u8,
            DType::U8 => b[o] = v as u8,
            DType::Bool => b[o] = (v != 0.0) as u8,
            DType::I16 => b[o..o + 2].copy_from_slice(&(v as i16).to_le_bytes()),
            DType::I32 => b[o..o + 4].copy_from_slice(&(v as i32).to_le_bytes()),
            DType::I64 => b[o..o + 8].copy_from_slice(&(v as i64).to_le_bytes()),
        }
    }

    /// Writes integer `v` as element `i` of `b` exactly where the type can hold it.
    pub fn store_i64(self, b: &mut [u8], i: usize, v: i64) {
        let o = i * self.size();
        match self {
            DType::I64 => b[o..o + 8].copy_from_slice(&v.to_le_bytes()),
            DType::I32 => b[o..o + 4].copy_from_slice(&(v as i32).to_le_bytes()),
            _ => self.store(b, i, v as f64),
        }
    }
}

/// IEEE half to f32.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = if exp == 0 {
        if man == 0 {
            sign
        } else {
            // Subnormal: normalise.
            let mut e = 127 - 15 + 1;
            let mut m = man;
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | ((e as u32) << 23) | ((m & 0x3ff) << 13)
        }
    } else if exp == 0x1f {
        sign | 0x7f80_0000 | (man << 13)
    } else {
        sign | ((exp + 127 - 15) << 23) | (man << 13)
    };
    f32::from_bits(bits)
}

/// f32 to IEEE half, rounding to nearest even.
pub fn f32_to_f16(f: f32) -> u16 {
    let x = f.to_bits();
    let sign = ((x >> 16) & 0x8000) as u16;
    let exp = ((x >> 23) & 0xff) as i32;
    let man = x & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rest = m & ((1 << shift) - 1);
        let mut r = m >> shift;
        if rest > half || (rest == half && (r & 1) == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (man >> 13);
    let rest = man & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && (r & 1) == 1) {
        r += 1;
    }
    sign | r as u16
}

/// bfloat16 to f32.
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// f32 to bfloat16, rounding to nearest even.
pub fn f32_to_bf16(f: f32) -> u16 {
    let x = f.to_bits();
    if f.is_nan() {
        return ((x >> 16) | 0x40) as u16;
    }
    let r = x.wrapping_add(0x7fff + ((x >> 16) & 1));
    (r >> 16) as u16
}

/// The first `N` bytes of `b` as an array (for `from_le_bytes`); `b` holds at least `N`.
pub fn bytes<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[..N]);
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_round_trips() {
        for v in [
            0.0f32,
            1.0,
            -2.5,
            0.099975586,
            65504.0,
            6.1035156e-5,
            5.9604645e-8,
        ] {
            assert_eq!(f16_to_f32(f32_to_f16(v)), v, "{v}");
        }
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(bf16_to_f32(f32_to_bf16(3.0)), 3.0);
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
    }
}
