//! MindSpore-style data-set pipelines: file round trips, sharding, determinism, transforms,
//! errors, resume and shutdown.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use shardc_ir::DType;
use shardc_runtime::data::{
    vision, write_synthetic_cifar10, write_synthetic_mnist, Cifar10Dataset, Cifar10Usage,
    DataError, Dataset, GeneratorDataset, MnistData, MnistDataset, MnistUsage, SourceOptions,
    Transform,
};
use shardc_runtime::Tensor;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn tmpdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

/// A data set whose row `i` is `(x = [i as f32, i as f32 * 10], y = i)`.
fn indexed(n: usize, opts: SourceOptions) -> Dataset {
    GeneratorDataset::new(
        &["x", "y"],
        n,
        |i| {
            Ok(vec![
                Tensor::from_f32(vec![2], vec![i as f32, i as f32 * 10.0]).unwrap(),
                Tensor::from_i32(vec![], vec![i as i32]).unwrap(),
            ])
        },
        opts,
    )
    .unwrap()
}

/// A data set of `n` 4x4x1 images, pixel (y, x) = 100 i + 4 y + x, label i.
fn images(n: usize, opts: SourceOptions) -> Dataset {
    GeneratorDataset::new(
        &["image", "label"],
        n,
        |i| {
            let px = (0..16).map(|p| (100 * i + p) as f32).collect();
            Ok(vec![
                Tensor::from_f32(vec![4, 4, 1], px).unwrap(),
                Tensor::from_i32(vec![], vec![i as i32]).unwrap(),
            ])
        },
        opts,
    )
    .unwrap()
}

fn collect(ds: &Dataset, epoch: u64) -> Vec<Vec<Tensor>> {
    ds.iter(epoch)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
}

fn labels(items: &[Vec<Tensor>], col: usize) -> Vec<i64> {
    items
        .iter()
        .flat_map(|it| it[col].to_f64_vec())
        .map(|v| v as i64)
        .collect()
}

fn apply(t: &Transform, x: Tensor, seed: u64) -> Result<Tensor, DataError> {
    t.apply(x, &mut ChaCha8Rng::seed_from_u64(seed))
}

fn img(h: usize, w: usize, c: usize, v: &[f32]) -> Tensor {
    Tensor::from_f32(vec![h, w, c], v.to_vec()).unwrap()
}

#[test]
fn pipelines_and_iterators_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<Dataset>();
    send::<shardc_runtime::data::DatasetIter>();
}

#[test]
fn cifar_synthetic_files_round_trip() {
    let d = tmpdir();
    write_synthetic_cifar10(d.path(), 7, 3).unwrap();
    for f in ["data_batch_1.bin", "data_batch_5.bin", "test_batch.bin"] {
        assert_eq!(std::fs::metadata(d.path().join(f)).unwrap().len(), 7 * 3073);
    }
    let meta = std::fs::read_to_string(d.path().join("batches.meta.txt")).unwrap();
    assert!(meta.starts_with("airplane\nautomobile\n"), "{meta}");
    let train =
        Cifar10Dataset::new(d.path(), Cifar10Usage::Train, SourceOptions::default()).unwrap();
    assert_eq!(train.get_dataset_size(), 35);
    assert_eq!(train.column_names(), vec!["image", "label"]);
    let test = Cifar10Dataset::new(d.path(), Cifar10Usage::Test, SourceOptions::default()).unwrap();
    assert_eq!(test.get_dataset_size(), 7);
    let all = Cifar10Dataset::new(d.path(), Cifar10Usage::All, SourceOptions::default()).unwrap();
    assert_eq!(all.get_dataset_size(), 42);
    // Row 9 is record 2 of data_batch_2.bin: compare with the raw bytes (CHW planar).
    let rows = collect(&train, 0);
    let raw = std::fs::read(d.path().join("data_batch_2.bin")).unwrap();
    let rec = &raw[2 * 3073..3 * 3073];
    let (image, label) = (&rows[9][0], &rows[9][1]);
    assert_eq!(image.shape, vec![32, 32, 3]);
    assert_eq!(image.dtype(), DType::Float32);
    assert_eq!(label.shape, Vec::<usize>::new());
    assert_eq!(label.dtype(), DType::Int32);
    assert_eq!(label.scalar_value(), Some(rec[0] as f64));
    let px = image.as_f32().unwrap();
    for (y, x, c) in [(0, 0, 0), (5, 17, 1), (31, 31, 2), (12, 3, 2)] {
        assert_eq!(
            px[(y * 32 + x) * 3 + c],
            rec[1 + c * 1024 + y * 32 + x] as f32
        );
    }
    // The parent of cifar-10-batches-bin is accepted too.
    let parent = tmpdir();
    let sub = parent.path().join("cifar-10-batches-bin");
    write_synthetic_cifar10(&sub, 2, 3).unwrap();
    let ds =
        Cifar10Dataset::new(parent.path(), Cifar10Usage::Test, SourceOptions::default()).unwrap();
    assert_eq!(ds.get_dataset_size(), 2);
    // Same seed, same bytes; the labels are spread over the classes.
    let d2 = tmpdir();
    write_synthetic_cifar10(d2.path(), 7, 3).unwrap();
    assert_eq!(
        raw,
        std::fs::read(d2.path().join("data_batch_2.bin")).unwrap()
    );
    let classes: BTreeSet<i64> = labels(&collect(&all, 0), 1).into_iter().collect();
    assert!(classes.len() >= 5, "{classes:?}");
}

#[test]
fn mnist_synthetic_files_round_trip() {
    let d = tmpdir();
    write_synthetic_mnist(d.path(), 30, 5).unwrap();
    let whole = MnistData::load_dir(d.path()).unwrap();
    let train = MnistDataset::new(d.path(), MnistUsage::Train, SourceOptions::default()).unwrap();
    assert_eq!(train.get_dataset_size(), 30);
    let rows = collect(&train, 0);
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(row[0].shape, vec![28, 28, 1]);
        let px = row[0].as_f32().unwrap();
        let want = &whole.images[i * 784..(i + 1) * 784];
        assert!(px
            .iter()
            .zip(want)
            .all(|(a, b)| (a / 255.0 - b).abs() < 1e-6));
        assert_eq!(row[1].scalar_value(), Some(whole.labels[i] as f64));
    }
    let test = MnistDataset::new(d.path(), MnistUsage::Test, SourceOptions::default()).unwrap();
    assert_eq!(test.get_dataset_size(), 5);
    let all = MnistDataset::new(d.path(), MnistUsage::All, SourceOptions::default()).unwrap();
    assert_eq!(all.get_dataset_size(), 35);
    // MindSpore's download layout: DIR/train/train-images-idx3-ubyte and the dotted spelling.
    let nested = tmpdir();
    let train_dir = nested.path().join("train");
    write_synthetic_mnist(&train_dir, 4, 5).unwrap();
    std::fs::rename(
        train_dir.join("train-images-idx3-ubyte"),
        train_dir.join("train-images.idx3-ubyte"),
    )
    .unwrap();
    let ds = MnistDataset::new(nested.path(), MnistUsage::Train, SourceOptions::default()).unwrap();
    assert_eq!(collect(&ds, 0).len(), 4);
}

#[test]
fn missing_and_truncated_files_name_the_path() {
    let d = tmpdir();
    let e = Cifar10Dataset::new(d.path(), Cifar10Usage::Train, SourceOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("data_batch_1.bin"), "{e}");
    write_synthetic_cifar10(d.path(), 3, 1).unwrap();
    let f = d.path().join("data_batch_3.bin");
    std::fs::write(&f, vec![1u8; 3 * 3073 - 5]).unwrap();
    let e = Cifar10Dataset::new(d.path(), Cifar10Usage::Train, SourceOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&f.display().to_string()) && e.contains("9214") && e.contains("3073"),
        "{e}"
    );
    // A label outside 0..=9 is found when the record is read.
    let f1 = d.path().join("data_batch_1.bin");
    let mut raw = std::fs::read(&f1).unwrap();
    raw[3073] = 12;
    std::fs::write(&f1, raw).unwrap();
    std::fs::write(&f, vec![1u8; 3 * 3073]).unwrap();
    let ds = Cifar10Dataset::new(d.path(), Cifar10Usage::Train, SourceOptions::default()).unwrap();
    let got: Vec<_> = ds.iter(0).unwrap().collect();
    assert_eq!(got.len(), 2);
    let e = got[1].as_ref().unwrap_err().to_string();
    assert!(
        e.contains(&f1.display().to_string()) && e.contains("label 12"),
        "{e}"
    );
    std::fs::remove_file(d.path().join("test_batch.bin")).unwrap();
    let e = Cifar10Dataset::new(d.path(), Cifar10Usage::Test, SourceOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("test_batch.bin"), "{e}");

    let m = tmpdir();
    write_synthetic_mnist(m.path(), 8, 1).unwrap();
    let img = m.path().join("train-images-idx3-ubyte");
    let bytes = std::fs::read(&img).unwrap();
    std::fs::write(&img, &bytes[..bytes.len() - 10]).unwrap();
    let e = MnistDataset::new(m.path(), MnistUsage::Train, SourceOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&img.display().to_string()) && e.contains("truncated"),
        "{e}"
    );
    std::fs::write(&img, [0u8, 0, 8, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap();
    let e = MnistDataset::new(m.path(), MnistUsage::Train, SourceOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains(&img.display().to_string()) && e.contains("bad magic"),
        "{e}"
    );
    std::fs::remove_file(m.path().join("t10k-labels-idx1-ubyte")).unwrap();
    let e = MnistDataset::new(m.path(), MnistUsage::Test, SourceOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("t10k-labels-idx1-ubyte"), "{e}");
}

/// Nearest-class-mean accuracy on the test split, with the class means of the training split.
fn nearest_mean_accuracy(train: &Dataset, test: &Dataset) -> f64 {
    let mut sums: Vec<Vec<f64>> = vec![Vec::new(); 10];
    let mut counts = [0usize; 10];
    for row in collect(train, 0) {
        let c = row[1].scalar_value().unwrap() as usize;
        let px = row[0].to_f64_vec();
        if sums[c].is_empty() {
            sums[c] = vec![0.0; px.len()];
        }
        sums[c].iter_mut().zip(&px).for_each(|(s, p)| *s += p);
        counts[c] += 1;
    }
    let means: Vec<Vec<f64>> = sums
        .iter()
        .zip(counts)
        .map(|(s, n)| s.iter().map(|v| v / n.max(1) as f64).collect())
        .collect();
    let rows = collect(test, 0);
    let right = rows
        .iter()
        .filter(|row| {
            let px = row[0].to_f64_vec();
            let best = (0..10)
                .filter(|&c| !means[c].is_empty())
                .min_by(|&a, &b| {
                    let d = |m: &Vec<f64>| -> f64 {
                        m.iter().zip(&px).map(|(x, y)| (x - y) * (x - y)).sum()
                    };
                    d(&means[a]).total_cmp(&d(&means[b]))
                })
                .unwrap();
            best as f64 == row[1].scalar_value().unwrap()
        })
        .count();
    right as f64 / rows.len() as f64
}

/// The synthetic sets are learnable: a nearest-class-mean classifier fitted on the training
/// files classifies the test file well, also after the tutorial's crop and flip.
#[test]
fn synthetic_sets_have_class_structure() {
    let d = tmpdir();
    write_synthetic_cifar10(d.path(), 40, 2).unwrap();
    let train =
        Cifar10Dataset::new(d.path(), Cifar10Usage::Train, SourceOptions::default()).unwrap();
    let augment = |ds: Dataset| {
        ds.map(
            vec![
                vision::RandomCrop((32, 32), (4, 4, 4, 4)),
                vision::RandomHorizontalFlip(0.5),
            ],
            &["image"],
        )
        .unwrap()
    };
    let test = Cifar10Dataset::new(d.path(), Cifar10Usage::Test, SourceOptions::default()).unwrap();
    let acc = nearest_mean_accuracy(&train, &test);
    assert!(acc > 0.9, "CIFAR accuracy {acc}");
    let acc = nearest_mean_accuracy(&augment(train), &augment(test));
    assert!(acc > 0.6, "CIFAR accuracy after crop and flip {acc}");
    let m = tmpdir();
    write_synthetic_mnist(m.path(), 120, 2).unwrap();
    let train = MnistDataset::new(m.path(), MnistUsage::Train, SourceOptions::default()).unwrap();
    let test = MnistDataset::new(m.path(), MnistUsage::Test, SourceOptions::default()).unwrap();
    let acc = nearest_mean_accuracy(&train, &test);
    assert!(acc > 0.9, "MNIST accuracy {acc}");
}

#[test]
fn shards_partition_the_data_set() {
    for shuffle in [false, true] {
        let opts = |k: usize, s: usize| SourceOptions {
            num_shards: k,
            shard_id: s,
            shuffle,
            seed: 11,
            num_samples: None,
        };
        // 12 rows over 4 shards: equal, disjoint, covering.
        let parts: Vec<Vec<i64>> = (0..4)
            .map(|s| labels(&collect(&indexed(12, opts(4, s)), 0), 1))
            .collect();
        let mut union = BTreeSet::new();
        for p in &parts {
            assert_eq!(p.len(), 3);
            for &v in p {
                assert!(union.insert(v), "row {v} in two shards (shuffle {shuffle})");
            }
        }
        assert_eq!(union, (0..12).collect());
        // 10 rows over 3 shards: 4 each, padded with the first rows of the order.
        let single = labels(&collect(&indexed(10, opts(1, 0)), 0), 1);
        let parts: Vec<Vec<i64>> = (0..3)
            .map(|s| labels(&collect(&indexed(10, opts(3, s)), 0), 1))
            .collect();
        for (s, p) in parts.iter().enumerate() {
            assert_eq!(p.len(), 4);
            for (j, &v) in p.iter().enumerate() {
                assert_eq!(v, single[(j * 3 + s) % 10], "shard {s} position {j}");
            }
        }
        let all: BTreeSet<i64> = parts.iter().flatten().copied().collect();
        assert_eq!(all, (0..10).collect());
    }
    let bad = SourceOptions {
        num_shards: 2,
        shard_id: 2,
        ..SourceOptions::default()
    };
    let e = GeneratorDataset::new(&["x"], 4, |_| Ok(vec![]), bad)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("shard_id 2") && e.contains("num_shards 2"),
        "{e}"
    );
}

/// The tutorial's per-rank pipeline: concatenated, the ranks' batches are the single device's
/// global batch, augmentations included.
#[test]
fn ranks_batches_rebuild_the_global_batch() {
    let (k, b) = (3usize, 2usize);
    let build = |num_shards: usize, shard_id: usize, batch: usize| {
        images(
            20,
            SourceOptions {
                num_shards,
                shard_id,
                shuffle: true,
                seed: 5,
                num_samples: None,
            },
        )
        .map(
            vec![
                vision::RandomCrop((4, 4), (1, 1, 1, 1)),
                vision::RandomHorizontalFlip(0.5),
            ],
            &["image"],
        )
        .unwrap()
        .batch(batch, true)
        .unwrap()
    };
    let global = collect(&build(1, 0, b * k), 2);
    let ranks: Vec<Vec<Vec<Tensor>>> = (0..k).map(|s| collect(&build(k, s, b), 2)).collect();
    assert_eq!(global.len(), 3);
    for (t, gb) in global.iter().enumerate() {
        let g = gb[0].as_f32().unwrap();
        let gl = gb[1].to_f64_vec();
        for (s, rank) in ranks.iter().enumerate() {
            let r = rank[t][0].as_f32().unwrap();
            let rl = rank[t][1].to_f64_vec();
            for j in 0..b {
                let row = j * k + s;
                assert_eq!(rl[j], gl[row]);
                assert_eq!(&r[j * 16..(j + 1) * 16], &g[row * 16..(row + 1) * 16]);
            }
        }
    }
}

#[test]
fn iteration_is_deterministic_across_runs_and_thread_counts() {
    let d = tmpdir();
    write_synthetic_cifar10(d.path(), 8, 9).unwrap();
    let build = |workers: usize, prefetch: usize| {
        Cifar10Dataset::new(
            d.path(),
            Cifar10Usage::Train,
            SourceOptions {
                shuffle: true,
                seed: 3,
                ..SourceOptions::default()
            },
        )
        .unwrap()
        .map(vec![vision::TypeCast(DType::Int32)], &["label"])
        .unwrap()
        .map(
            vec![
                vision::RandomCrop((32, 32), (4, 4, 4, 4)),
                vision::RandomHorizontalFlip(0.5),
                vision::Resize((12, 12)),
                vision::Rescale(1.0 / 255.0, 0.0),
                vision::Normalize(&[0.4465, 0.4822, 0.4914], &[0.2010, 0.1994, 0.2023]),
                vision::HWC2CHW(),
            ],
            &["image"],
        )
        .unwrap()
        .shuffle(10)
        .unwrap()
        .batch(6, true)
        .unwrap()
        .repeat(2)
        .num_parallel_workers(workers)
        .unwrap()
        .prefetch_size(prefetch)
        .unwrap()
    };
    let a = collect(&build(1, 1), 0);
    assert_eq!(a.len(), 12);
    assert_eq!(a[0][0].shape, vec![6, 3, 12, 12]);
    assert_eq!(a[0][1].shape, vec![6]);
    assert_eq!(a, collect(&build(1, 1), 0));
    assert_eq!(a, collect(&build(3, 2), 0));
    assert_eq!(a, collect(&build(4, 16), 0));
    assert_ne!(a, collect(&build(2, 4), 1));
}

#[test]
fn shuffle_changes_the_order_per_epoch_deterministically() {
    for with_buffer in [false, true] {
        let mut ds = indexed(
            40,
            SourceOptions {
                shuffle: !with_buffer,
                seed: 1,
                ..SourceOptions::default()
            },
        );
        if with_buffer {
            ds = ds.shuffle(8).unwrap();
        }
        let e0 = labels(&collect(&ds, 0), 1);
        let e1 = labels(&collect(&ds, 1), 1);
        assert_eq!(e0, labels(&collect(&ds, 0), 1));
        assert_ne!(e0, e1);
        assert_ne!(e0, (0..40).collect::<Vec<_>>());
        let (mut s0, mut s1) = (e0.clone(), e1.clone());
        s0.sort();
        s1.sort();
        assert_eq!(s0, (0..40).collect::<Vec<_>>());
        assert_eq!(s0, s1);
    }
    // Repeat: each repetition is a new pass with its own permutation.
    let ds = indexed(
        10,
        SourceOptions {
            shuffle: true,
            seed: 4,
            ..SourceOptions::default()
        },
    )
    .repeat(2);
    let both = labels(&collect(&ds, 0), 1);
    assert_eq!(both.len(), 20);
    assert_ne!(both[..10], both[10..]);
}

#[test]
fn transforms_match_hand_computed_cases() {
    // Resize 2x2 -> 4x4, half-pixel centres: a row [1, 2] becomes [1, 1.25, 1.75, 2].
    let x = img(2, 2, 1, &[1.0, 2.0, 3.0, 4.0]);
    let r = apply(&vision::Resize((4, 4)), x.clone(), 0).unwrap();
    assert_eq!(r.shape, vec![4, 4, 1]);
    #[rustfmt::skip]
    let want = [
        1.0, 1.25, 1.75, 2.0,
        1.5, 1.75, 2.25, 2.5,
        2.5, 2.75, 3.25, 3.5,
        3.0, 3.25, 3.75, 4.0,
    ];
    assert_eq!(r.as_f32().unwrap(), &want);
    // Resize 2x2 -> 1x1 averages; 2x2 -> 3x3 keeps the centre at the mean.
    let r = apply(&vision::Resize((1, 1)), x.clone(), 0).unwrap();
    assert_eq!(r.as_f32().unwrap(), &[2.5]);
    let r = apply(&vision::Resize((3, 3)), x.clone(), 0).unwrap();
    assert_eq!(r.as_f32().unwrap()[4], 2.5);
    assert_eq!(r.as_f32().unwrap()[0], 1.0);

    // RandomCrop: pad left by 1 then crop 2x2 from the 2x3 padded image [[0,1,2],[0,3,4]].
    let crop = vision::RandomCrop((2, 2), (1, 0, 0, 0));
    let mut seen = BTreeSet::new();
    for seed in 0..64 {
        let c = apply(&crop, x.clone(), seed).unwrap();
        let v: Vec<i64> = c.to_f64_vec().iter().map(|&v| v as i64).collect();
        assert!(v == [0, 1, 0, 3] || v == [1, 2, 3, 4], "{v:?}");
        seen.insert(v);
    }
    assert_eq!(seen.len(), 2, "both windows occur");
    // The whole padded image when the crop is its size: zeros around.
    let c = apply(&vision::RandomCrop((4, 3), (1, 1, 0, 1)), x.clone(), 9).unwrap();
    assert_eq!(
        c.as_f32().unwrap(),
        &[0.0, 0.0, 0.0, 0.0, 1.0, 2.0, 0.0, 3.0, 4.0, 0.0, 0.0, 0.0]
    );

    // Flip: always / never, with 2 channels kept together.
    let x2 = img(1, 3, 2, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let f = apply(&vision::RandomHorizontalFlip(1.0), x2.clone(), 1).unwrap();
    assert_eq!(f.as_f32().unwrap(), &[5.0, 6.0, 3.0, 4.0, 1.0, 2.0]);
    let f = apply(&vision::RandomHorizontalFlip(0.0), x2.clone(), 1).unwrap();
    assert_eq!(f, x2);

    // Normalize over the last axis of HWC; Rescale; HWC2CHW; TypeCast.
    let x3 = img(1, 2, 3, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let n = apply(
        &vision::Normalize(&[1.0, 2.0, 3.0], &[1.0, 2.0, 4.0]),
        x3.clone(),
        0,
    )
    .unwrap();
    assert_eq!(n.as_f32().unwrap(), &[0.0, 0.0, 0.0, 3.0, 1.5, 0.75]);
    let s = apply(&vision::Rescale(0.5, -1.0), x3.clone(), 0).unwrap();
    assert_eq!(s.as_f32().unwrap(), &[-0.5, 0.0, 0.5, 1.0, 1.5, 2.0]);
    let t = apply(&vision::HWC2CHW(), x3.clone(), 0).unwrap();
    assert_eq!(t.shape, vec![3, 1, 2]);
    assert_eq!(t.as_f32().unwrap(), &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    let f = Tensor::from_f32(vec![3], vec![1.9, -2.7, 3.0]).unwrap();
    let i = apply(&vision::TypeCast(DType::Int32), f, 0).unwrap();
    assert_eq!(i.data, shardc_runtime::Data::I32(vec![1, -2, 3]));
}

#[test]
fn transforms_say_which_transform_and_shape_failed() {
    let x = img(2, 2, 1, &[1.0, 2.0, 3.0, 4.0]);
    let e = apply(&vision::Normalize(&[0.5; 3], &[0.2; 3]), x.clone(), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("Normalize") && e.contains("[2, 2, 1]"), "{e}");
    let flat = Tensor::from_f32(vec![4], vec![0.0; 4]).unwrap();
    let e = apply(&vision::HWC2CHW(), flat.clone(), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("HWC2CHW") && e.contains("[4]"), "{e}");
    let e = apply(&vision::RandomCrop((5, 5), (1, 1, 1, 1)), x.clone(), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("RandomCrop") && e.contains("4x4"), "{e}");
    let e = apply(&vision::RandomHorizontalFlip(1.5), x.clone(), 0)
        .unwrap_err()
        .to_string();
    assert!(e.contains("prob 1.5"), "{e}");
    // In a pipeline: the row and column are named too.
    let ds = indexed(3, SourceOptions::default())
        .map(vec![vision::Resize((2, 2))], &["x"])
        .unwrap();
    let e = ds.iter(0).unwrap().next().unwrap().unwrap_err().to_string();
    assert!(
        e.contains("row 0") && e.contains("\"x\"") && e.contains("Resize"),
        "{e}"
    );
}

#[test]
fn pipeline_misuse_is_an_error_naming_the_thing() {
    let e = indexed(4, SourceOptions::default())
        .map(vec![vision::Rescale(1.0, 0.0)], &["image"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("\"image\"") && e.contains("x, y"), "{e}");
    assert!(indexed(4, SourceOptions::default())
        .batch(0, false)
        .is_err());
    assert!(indexed(4, SourceOptions::default()).shuffle(0).is_err());
    let e = indexed(4, SourceOptions::default())
        .repeat(0)
        .iter(0)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("repeat(0)"), "{e}");
    let e = indexed(4, SourceOptions::default())
        .batch(2, false)
        .unwrap()
        .map(vec![vision::HWC2CHW()], &["x"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("after batch"), "{e}");
    let e = indexed(4, SourceOptions::default())
        .iter_from(0, 5)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("skip 5") && e.contains("4"), "{e}");
}

#[test]
fn batches_stack_rows_and_refuse_ragged_ones() {
    let ds = indexed(7, SourceOptions::default());
    let keep = ds.clone().batch(3, false).unwrap();
    assert_eq!(keep.get_dataset_size(), 3);
    let items = collect(&keep, 0);
    assert_eq!(items[0][0].shape, vec![3, 2]);
    assert_eq!(
        items[0][0].as_f32().unwrap(),
        &[0.0, 0.0, 1.0, 10.0, 2.0, 20.0]
    );
    assert_eq!(items[2][0].shape, vec![1, 2]);
    assert_eq!(items[2][1].shape, vec![1]);
    let drop = ds.clone().batch(3, true).unwrap().repeat(2);
    assert_eq!(drop.get_dataset_size(), 4);
    assert_eq!(collect(&drop, 0).len(), 4);

    let ragged = GeneratorDataset::new(
        &["v"],
        4,
        |i| {
            Ok(vec![Tensor::from_f32(
                vec![1 + i / 2],
                vec![0.0; 1 + i / 2],
            )
            .unwrap()])
        },
        SourceOptions::default(),
    )
    .unwrap()
    .batch(4, false)
    .unwrap();
    let e = ragged
        .iter(0)
        .unwrap()
        .next()
        .unwrap()
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"v\"") && e.contains("[1]") && e.contains("[2]"),
        "{e}"
    );
}

#[test]
fn iter_from_skips_without_decoding() {
    let fetched = Arc::new(Mutex::new(Vec::new()));
    let log = fetched.clone();
    let ds = GeneratorDataset::new(
        &["x"],
        30,
        move |i| {
            log.lock().unwrap().push(i);
            Ok(vec![Tensor::from_i32(vec![], vec![i as i32]).unwrap()])
        },
        SourceOptions {
            shuffle: true,
            seed: 8,
            ..SourceOptions::default()
        },
    )
    .unwrap()
    .map(vec![vision::TypeCast(DType::Float32)], &["x"])
    .unwrap()
    .batch(4, false)
    .unwrap()
    .repeat(2);
    let full = collect(&ds, 3);
    assert_eq!(full.len(), 16);
    for skip in [0, 5, 8, 11, 16] {
        fetched.lock().unwrap().clear();
        let resumed: Vec<_> = ds
            .iter_from(3, skip)
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(resumed, full[skip..], "skip {skip}");
        // Exactly the rows of the items left were read: skipped ones never.
        let want: usize = full[skip..].iter().map(|b| b[0].shape[0]).sum();
        assert_eq!(fetched.lock().unwrap().len(), want, "skip {skip}");
    }
}

#[test]
fn a_worker_error_arrives_once_then_the_iterator_ends() {
    let ds = GeneratorDataset::new(
        &["x"],
        20,
        |i| {
            if i == 5 {
                Err(DataError::Mismatch(format!("row {i} is broken")))
            } else if i == 9 {
                panic!("generator panicked at {i}")
            } else {
                Ok(vec![Tensor::from_i32(vec![], vec![i as i32]).unwrap()])
            }
        },
        SourceOptions::default(),
    )
    .unwrap()
    .num_parallel_workers(3)
    .unwrap();
    let got: Vec<_> = ds.iter(0).unwrap().collect();
    assert_eq!(got.len(), 6);
    assert!(got[..5].iter().all(|r| r.is_ok()));
    let e = got[5].as_ref().unwrap_err().to_string();
    assert!(e.contains("row 5 is broken"), "{e}");
    // A panic in a worker is an error item too, not a hang.
    let got: Vec<_> = ds.iter_from(0, 6).unwrap().collect();
    assert_eq!(got.len(), 4);
    let e = got[3].as_ref().unwrap_err().to_string();
    assert!(
        e.contains("panicked") && e.contains("generator panicked at 9"),
        "{e}"
    );
}

#[test]
fn dropping_an_iterator_midway_stops_its_threads_promptly() {
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let ds = GeneratorDataset::new(
        &["x"],
        10_000,
        move |i| {
            c.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(2));
            Ok(vec![Tensor::from_i32(vec![], vec![i as i32]).unwrap()])
        },
        SourceOptions::default(),
    )
    .unwrap()
    .batch(4, true)
    .unwrap()
    .num_parallel_workers(3)
    .unwrap()
    .prefetch_size(3)
    .unwrap();
    let mut it = ds.iter(0).unwrap();
    for _ in 0..2 {
        it.next().unwrap().unwrap();
    }
    let t = Instant::now();
    drop(it);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    let after = calls.load(Ordering::SeqCst);
    // Bounded prefetch: no more than (delivered + prefetch + workers) batches were read.
    assert!(after <= (2 + 3 + 3) * 4, "{after} rows read");
    std::thread::sleep(Duration::from_millis(30));
    assert_eq!(calls.load(Ordering::SeqCst), after, "threads still running");
}

/// The tutorial's CIFAR-10 pipeline (crop, flip, resize to 224, rescale, normalize, HWC2CHW,
/// batch 32): images per second. `cargo test --release -p shardc-runtime --test datasets --
/// --ignored --nocapture`.
#[test]
#[ignore]
fn tutorial_cifar_pipeline_throughput() {
    let d = tmpdir();
    write_synthetic_cifar10(d.path(), 200, 1).unwrap();
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    for size in [32usize, 224] {
        let ds = Cifar10Dataset::new(d.path(), Cifar10Usage::Train, SourceOptions::default())
            .unwrap()
            .map(vec![vision::TypeCast(DType::Int32)], &["label"])
            .unwrap()
            .map(
                vec![
                    vision::RandomCrop((32, 32), (4, 4, 4, 4)),
                    vision::RandomHorizontalFlip(0.5),
                    vision::Resize((size, size)),
                    vision::Rescale(1.0 / 255.0, 0.0),
                    vision::Normalize(&[0.4465, 0.4822, 0.4914], &[0.2010, 0.1994, 0.2023]),
                    vision::HWC2CHW(),
                ],
                &["image"],
            )
            .unwrap()
            .shuffle(10)
            .unwrap()
            .batch(32, true)
            .unwrap()
            .num_parallel_workers(workers)
            .unwrap();
        let t = Instant::now();
        let n: usize = ds.iter(0).unwrap().map(|b| b.unwrap()[1].shape[0]).sum();
        let s = t.elapsed().as_secs_f64();
        println!(
            "resize {size}: {n} images in {s:.3} s = {:.0} images/s ({workers} workers)",
            n as f64 / s
        );
    }
}
