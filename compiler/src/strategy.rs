//! Writing strategies as MindSpore users do: `((2, 4), (4, 1))`.
//!
//! [`IntoStrategy`] turns nested Rust tuples of integers (up to 4 inputs of up to 5
//! dimensions, any integer type), `Vec<Vec<i64>>`, arrays, and [`Strategy`] itself into a
//! [`Strategy`]. A one-input strategy is a one-element tuple: `((2, 4),)`. The conversion never
//! fails; out-of-range numbers become a split count that the op's `call` rejects with an error
//! naming the op instance.

use shardc_ir::Strategy;

/// An integer usable as a split count. Conversions saturate at the bounds of `i64` (an
/// unusable count, rejected when the op is added).
pub trait SplitCount: Copy {
    /// The count as `i64`.
    fn to_split(self) -> i64;
}

macro_rules! split_count {
    ($($t:ty),*) => {$(
        impl SplitCount for $t {
            fn to_split(self) -> i64 {
                i64::try_from(self).unwrap_or(i64::MAX)
            }
        }
    )*};
}

split_count!(i8, i16, i32, i64, isize, u8, u16, u32, u64, usize, i128, u128);

/// The split counts of one input: a tuple `(2, 4)`, a `Vec`, a slice or an array.
pub trait IntoDims {
    /// The split count of each dimension.
    fn into_dims(self) -> Vec<i64>;
}

impl<T: SplitCount> IntoDims for Vec<T> {
    fn into_dims(self) -> Vec<i64> {
        self.into_iter().map(SplitCount::to_split).collect()
    }
}

impl<T: SplitCount> IntoDims for &[T] {
    fn into_dims(self) -> Vec<i64> {
        self.iter().map(|x| x.to_split()).collect()
    }
}

impl<T: SplitCount, const N: usize> IntoDims for [T; N] {
    fn into_dims(self) -> Vec<i64> {
        self.iter().map(|x| x.to_split()).collect()
    }
}

impl IntoDims for () {
    fn into_dims(self) -> Vec<i64> {
        Vec::new()
    }
}

macro_rules! dims_tuple {
    ($($name:ident),+) => {
        impl<$($name: SplitCount),+> IntoDims for ($($name,)+) {
            #[allow(non_snake_case)]
            fn into_dims(self) -> Vec<i64> {
                let ($($name,)+) = self;
                vec![$($name.to_split()),+]
            }
        }
    };
}

dims_tuple!(A);
dims_tuple!(A, B);
dims_tuple!(A, B, C);
dims_tuple!(A, B, C, D);
dims_tuple!(A, B, C, D, E);

/// Anything that reads as a strategy: `((2, 4), (4, 1))`, `((2, 4),)`, `vec![vec![2, 4]]`,
/// `[[2, 4], [4, 1]]`, or a [`Strategy`].
pub trait IntoStrategy {
    /// The strategy.
    fn into_strategy(self) -> Strategy;
}

impl IntoStrategy for Strategy {
    fn into_strategy(self) -> Strategy {
        self
    }
}

impl IntoStrategy for &Strategy {
    fn into_strategy(self) -> Strategy {
        self.clone()
    }
}

impl<D: IntoDims> IntoStrategy for Vec<D> {
    fn into_strategy(self) -> Strategy {
        Strategy(self.into_iter().map(IntoDims::into_dims).collect())
    }
}

impl<D: IntoDims, const N: usize> IntoStrategy for [D; N] {
    fn into_strategy(self) -> Strategy {
        Strategy(self.into_iter().map(IntoDims::into_dims).collect())
    }
}

macro_rules! strategy_tuple {
    ($($name:ident),+) => {
        impl<$($name: IntoDims),+> IntoStrategy for ($($name,)+) {
            #[allow(non_snake_case)]
            fn into_strategy(self) -> Strategy {
                let ($($name,)+) = self;
                Strategy(vec![$($name.into_dims()),+])
            }
        }
    };
}

strategy_tuple!(A);
strategy_tuple!(A, B);
strategy_tuple!(A, B, C);
strategy_tuple!(A, B, C, D);

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: impl IntoStrategy) -> Vec<Vec<i64>> {
        x.into_strategy().0
    }

    #[test]
    fn tuples_read_like_mindspore() {
        assert_eq!(s(((2, 4), (4, 1))), vec![vec![2, 4], vec![4, 1]]);
        assert_eq!(s(((2, 4),)), vec![vec![2, 4]]);
        assert_eq!(s(((1, 2, 4),)), vec![vec![1, 2, 4]]);
        assert_eq!(s(((8,),)), vec![vec![8]]);
        assert_eq!(
            s(((1, 2, 1, 1, 1), (2, 1), (1,), (1, 1, 1, 1))),
            vec![vec![1, 2, 1, 1, 1], vec![2, 1], vec![1], vec![1, 1, 1, 1]]
        );
        assert_eq!(
            s(((2u8, 4usize), (4i64, 1u32))),
            vec![vec![2, 4], vec![4, 1]]
        );
    }

    #[test]
    fn vectors_arrays_and_strategies() {
        assert_eq!(
            s(vec![vec![2i64, 4], vec![4, 1]]),
            vec![vec![2, 4], vec![4, 1]]
        );
        assert_eq!(s([[2, 4], [4, 1]]), vec![vec![2, 4], vec![4, 1]]);
        let st = Strategy(vec![vec![1, 8]]);
        assert_eq!(s(&st), vec![vec![1, 8]]);
        assert_eq!(s(st), vec![vec![1, 8]]);
    }

    #[test]
    fn out_of_range_saturates() {
        assert_eq!(s(((u64::MAX, 1),)), vec![vec![i64::MAX, 1]]);
        assert_eq!(s(((-1, 0),)), vec![vec![-1, 0]]);
    }
}
