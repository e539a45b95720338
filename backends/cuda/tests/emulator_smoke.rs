use shardc_backend_cuda::emulator::EmulatedDevice;
use shardc_backend_cuda::kernels::KernelArg;
use shardc_backend_cuda::Device;

#[test]
fn softmax_runs() {
    let d = EmulatedDevice::new(64).unwrap();
    println!("{} kernels", d.kernel_names().len());
    let x: Vec<f32> = (0..300).map(|i| (i % 17) as f32 * 0.1).collect();
    let bytes: Vec<u8> = x.iter().flat_map(|v| v.to_ne_bytes()).collect();
    let px = d.alloc(bytes.len()).unwrap();
    let py = d.alloc(bytes.len()).unwrap();
    d.upload(px, &bytes).unwrap();
    d.launch("softmax_f32", 3, 64, &[KernelArg::Ptr(px), KernelArg::Ptr(py), KernelArg::I64(3), KernelArg::I64(100), KernelArg::I32(0)]).unwrap();
    let mut out = vec![0u8; bytes.len()];
    d.download(py, &mut out).unwrap();
    let y: Vec<f32> = out.chunks(4).map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]])).collect();
    let s: f32 = y[..100].iter().sum();
    assert!((s - 1.0).abs() < 1e-5, "{s}");
}
