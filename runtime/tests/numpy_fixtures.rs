//! Files NumPy itself wrote (`tests/data/numpy/make.py`, versions in `VERSIONS`) read
//! element for element: `np.savez` and `np.savez_compressed` archives, a `uint8` image
//! widened to Int32, a Fortran-order float64 array and a big-endian float32 one rearranged
//! to C order; and a `NumpySlicesDataset` over the archive batching its rows.

use shardc_ir::DType;
use shardc_runtime::data::numpy::{read_arrays, read_npy, read_npz};
use shardc_runtime::data::{NumpySlicesDataset, SourceOptions};
use shardc_runtime::Tensor;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/numpy")
        .join(name)
}

/// `make.py`'s `x`: `arange(24).reshape(4, 6) / 8 - 1`.
fn x_values() -> Vec<f64> {
    (0..24).map(|i| i as f64 / 8.0 - 1.0).collect()
}

fn named<'a>(arrays: &'a [(String, Tensor)], name: &str) -> &'a Tensor {
    &arrays
        .iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no {name}"))
        .1
}

#[test]
fn numpys_archives_read_element_for_element() {
    let arrays = read_npz(&fixture("arrays.npz")).expect("arrays.npz");
    let names: Vec<&str> = arrays.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["x", "label", "mask", "wide", "half"]);
    let x = named(&arrays, "x");
    assert_eq!(
        (x.dtype(), x.shape.as_slice()),
        (DType::Float32, &[4, 6][..])
    );
    assert_eq!(x.to_f64_vec(), x_values());
    assert_eq!(
        named(&arrays, "label"),
        &Tensor::from_i32(vec![4], vec![3, 0, 2, 1]).unwrap()
    );
    let mask = named(&arrays, "mask");
    assert_eq!(mask.dtype(), DType::Bool);
    assert_eq!(mask.to_f64_vec(), [1.0, 0.0, 1.0, 1.0]);
    assert_eq!(
        named(&arrays, "wide"),
        &Tensor::from_i64(vec![4], (0..4).map(|i| i << 40).collect()).unwrap()
    );
    let half = named(&arrays, "half");
    assert_eq!(
        (half.dtype(), half.shape.as_slice()),
        (DType::Float16, &[4, 2][..])
    );
    let want: Vec<f64> = (0..8).map(|i| -2.0 + 4.0 * i as f64 / 7.0).collect();
    for (a, b) in half.to_f64_vec().iter().zip(&want) {
        assert!((a - b).abs() <= 1e-3 * b.abs().max(1.0), "{a} vs {b}");
    }
    // The compressed archive holds the same x and label.
    let c = read_npz(&fixture("compressed.npz")).expect("compressed.npz");
    assert_eq!(named(&c, "x"), x);
    assert_eq!(named(&c, "label"), named(&arrays, "label"));
}

#[test]
fn other_layouts_and_narrow_integers_read_as_c_order() {
    let image = read_npy(&fixture("image_uint8.npy")).expect("image");
    assert_eq!(image.dtype(), DType::Int32);
    assert_eq!(image.shape, [4, 3, 2]);
    let want: Vec<f64> = (0..24).map(|i| ((i * 9) % 256) as f64).collect();
    assert_eq!(image.to_f64_vec(), want);
    for name in ["x_fortran.npy", "x_big_endian.npy"] {
        let t = read_npy(&fixture(name)).expect(name);
        assert_eq!(t.shape, [4, 6], "{name}");
        assert_eq!(t.to_f64_vec(), x_values(), "{name}");
    }
    assert_eq!(
        read_npy(&fixture("x_fortran.npy")).unwrap().dtype(),
        DType::Float64
    );
    // A single .npy through read_arrays is named by its stem.
    let one = read_arrays(&fixture("image_uint8.npy")).unwrap();
    assert_eq!(one[0].0, "image_uint8");
}

#[test]
fn a_slices_dataset_over_numpys_archive_batches_its_rows() {
    let ds = NumpySlicesDataset::from_file(
        &fixture("arrays.npz"),
        Some(&["x", "label"]),
        SourceOptions::default(),
    )
    .expect("data set")
    .batch(2, true)
    .expect("batch");
    let batches: Vec<Vec<Tensor>> = ds.iter(0).unwrap().map(|b| b.unwrap()).collect();
    assert_eq!(batches.len(), 2);
    assert_eq!(batches[1][0].shape, [2, 6]);
    assert_eq!(batches[1][0].to_f64_vec(), x_values()[12..].to_vec());
    assert_eq!(batches[1][1].to_f64_vec(), [2.0, 1.0]);
}
