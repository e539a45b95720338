//! A lost rank ends the job: a step waiting past `SHARDC_COMM_TIMEOUT` for a member that never
//! issues its collective fails, naming the collective, its group and the rank.

mod common;

use shardc_backend_ascend::{AscendDevice, AscendExecutor, HcclComm};
use shardc_backend_cpu::CpuBackend;
use shardc_ir::{DType, TensorType};
use shardc_runtime::{InProcessWorld, Tensor};
use std::sync::Arc;

#[test]
fn a_step_waiting_past_the_timeout_for_a_member_fails_naming_its_collective() {
    // Before any device is opened in this test binary: every wait is bounded by 1 s.
    std::env::set_var("SHARDC_COMM_TIMEOUT", "1");
    // The emulated HCCL gives up on the lost member after 3 s (the stream is freed then).
    std::env::set_var("HCCL_EXEC_TIMEOUT", "3");
    common::use_emulator();
    let text = "%para1_x : <Tensor[Float32], (4)>

subgraph @Sum(%para1_x) {
  %1(total) = AllReduce(%para1_x) {instance name: total} primitive_attrs: {group: (0, 1), op: sum}
  Return(%1)
}";
    let graph = || {
        let mut g = shardc_ir::text::parse_graph(text, "sum.ir").expect("parses");
        shardc_passes::infer::infer_graph(&mut g).expect("types");
        g
    };
    let host = Arc::new(CpuBackend::with_threads(1));
    let done = std::sync::Barrier::new(2);
    let results: Vec<Result<Vec<String>, String>> = std::thread::scope(|s| {
        let hs: Vec<_> = InProcessWorld::new(2)
            .into_iter()
            .enumerate()
            .map(|(rank, boot)| {
                let (host, done, graph) = (host.clone(), &done, &graph);
                s.spawn(move || {
                    let dev = AscendDevice::open(rank).map_err(|e| e.to_string())?;
                    let comm =
                        Arc::new(HcclComm::new(dev.clone(), boot).map_err(|e| e.to_string())?);
                    let mut e = AscendExecutor::with_hccl(graph(), dev, host, comm)
                        .map_err(|e| e.to_string())?;
                    let mut errors = Vec::new();
                    if rank == 0 {
                        let x = Tensor::zeros(&TensorType::new(DType::Float32, vec![4]));
                        let start = std::time::Instant::now();
                        let r = e.step(&[("x", x)]).err();
                        errors.push(r.map(|e| e.to_string()).unwrap_or_default());
                        errors.push(format!("{:.1}", start.elapsed().as_secs_f64()));
                    }
                    done.wait();
                    Ok(errors)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())))
            .collect()
    });
    let errors = results[0].as_ref().expect("rank 0 ran");
    assert!(
        errors[0].contains("rank 0")
            && errors[0].contains("SHARDC_COMM_TIMEOUT")
            && errors[0].contains("AllReduce 'total' on ranks [0, 1]"),
        "{errors:?}"
    );
    let secs: f64 = errors[1].parse().expect("seconds");
    assert!(secs < 30.0, "the step took {secs} s: {errors:?}");
    assert!(results[1].is_ok(), "{:?}", results[1]);
}
