//! Executors of aclnn's two-phase API: what `aclnnXxxGetWorkspaceSize` prepares (a [`Plan`]:
//! the tensors' device regions, the workspace size, the reference computation) and how
//! `aclnnXxx` launches it on a stream.

use crate::acl;
use crate::diag::EmuResult;
use crate::mem::{AccessReq, Resolved};
use crate::stream;
use crate::tensor::TensorDesc;
use crate::{bail, emu_err};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The computation of a plan, run on the stream's thread with the resolved regions.
pub type Run = Box<dyn FnOnce(&[Resolved]) -> EmuResult<()> + Send>;

/// A tensor argument of a plan: its descriptor and the index of its region (None when it is
/// empty and touches no memory).
#[derive(Clone)]
pub struct Arg {
    /// The descriptor.
    pub t: Arc<TensorDesc>,
    i: Option<usize>,
}

impl Arg {
    fn res<'a>(&self, res: &'a [Resolved]) -> Option<&'a Resolved> {
        self.i.map(|i| &res[i])
    }
    /// The view's values as f32, row-major.
    pub fn f32(&self, res: &[Resolved]) -> Vec<f32> {
        self.res(res).map_or(Vec::new(), |r| self.t.read_f32(r))
    }
    /// The view's values as f64, row-major.
    pub fn f64(&self, res: &[Resolved]) -> Vec<f64> {
        self.res(res).map_or(Vec::new(), |r| self.t.read_f64(r))
    }
    /// The view's values as i64, row-major.
    pub fn i64(&self, res: &[Resolved]) -> Vec<i64> {
        self.res(res).map_or(Vec::new(), |r| self.t.read_i64(r))
    }
    /// Writes f32 values (row-major) through the view.
    pub fn put32(&self, res: &[Resolved], v: &[f32]) {
        if let Some(r) = self.res(res) {
            self.t.write_f32(r, v)
        }
    }
    /// Writes f64 values (row-major) through the view.
    pub fn put64(&self, res: &[Resolved], v: &[f64]) {
        if let Some(r) = self.res(res) {
            self.t.write_f64(r, v)
        }
    }
    /// Writes integers (row-major) through the view.
    pub fn puti(&self, res: &[Resolved], v: &[i64]) {
        if let Some(r) = self.res(res) {
            self.t.write_i64(r, v)
        }
    }
    /// View dims.
    pub fn dims(&self) -> &[i64] {
        &self.t.dims
    }
}

/// What `GetWorkspaceSize` prepared.
pub struct Plan {
    reqs: Vec<AccessReq>,
    /// Workspace bytes the launch must provide.
    pub workspace: u64,
    run: Option<Run>,
}

impl Default for Plan {
    fn default() -> Self {
        Self::new()
    }
}

impl Plan {
    /// An empty plan.
    pub fn new() -> Plan {
        Plan {
            reqs: Vec::new(),
            workspace: 0,
            run: None,
        }
    }

    fn arg(&mut self, t: &Arc<TensorDesc>, write: bool, role: &str) -> Arg {
        let i = if t.numel() == 0 {
            None
        } else {
            self.reqs.push(t.req(write, role));
            Some(self.reqs.len() - 1)
        };
        Arg { t: t.clone(), i }
    }

    /// Adds a tensor the op reads.
    pub fn input(&mut self, t: &Arc<TensorDesc>, role: &str) -> Arg {
        self.arg(t, false, role)
    }

    /// Adds a tensor the op writes (or reads and writes).
    pub fn output(&mut self, t: &Arc<TensorDesc>, role: &str) -> Arg {
        self.arg(t, true, role)
    }

    /// Sets the workspace size.
    pub fn with_workspace(mut self, bytes: u64) -> Plan {
        self.workspace = bytes;
        self
    }

    /// Sets the computation.
    pub fn with_run(
        mut self,
        f: impl FnOnce(&[Resolved]) -> EmuResult<()> + Send + 'static,
    ) -> Plan {
        self.run = Some(Box::new(f));
        self
    }
}

/// A workspace size for an op whose output has `bytes` bytes: at least 512, so every
/// matmul / convolution / reduction asks for one and a launch without it is caught.
pub fn scratch(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(512).max(1) * 512
}

struct Exec {
    op: &'static str,
    plan: Plan,
}

const EXEC_TAG: usize = 0x7e00_0000_0000;

fn execs() -> std::sync::MutexGuard<'static, HashMap<usize, Exec>> {
    static E: OnceLock<Mutex<HashMap<usize, Exec>>> = OnceLock::new();
    E.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Registers a prepared plan of `op`; returns (workspace size, executor handle).
pub fn register(op: &'static str, plan: Plan) -> (u64, usize) {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
    let h = EXEC_TAG + NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) * 64;
    let ws = plan.workspace;
    execs().insert(h, Exec { op, plan });
    (ws, h)
}

/// Bytes written into a workspace before the op runs, so that a workspace aliasing live data
/// shows up as corrupted results.
const SCRIBBLE: u8 = 0xa5;

/// `aclnnXxx(workspace, workspaceSize, executor, stream)`: checks the executor (live, not yet
/// launched, made by `op`'s GetWorkspaceSize) and the workspace (at least the size asked
/// for, live device memory of the stream's device), then enqueues the plan.
pub fn launch(
    op: &'static str,
    workspace: u64,
    ws_size: u64,
    exec: usize,
    stream_h: usize,
) -> EmuResult<()> {
    if exec == 0 {
        bail!(NullPtr, "{op}: executor is null");
    }
    let s = acl::stream_or_default(op, stream_h)?;
    let ex = {
        let mut m = execs();
        match m.remove(&exec) {
            None => bail!(
                BadExecutor,
                "{op}: executor {exec:#x} is not live (already launched, or never made by {op}GetWorkspaceSize)"
            ),
            Some(e) if e.op != op => {
                let made_by = e.op;
                // Still live for its own launch.
                m.insert(exec, e);
                bail!(
                    BadExecutor,
                    "{op}: executor {exec:#x} was made by {made_by}GetWorkspaceSize, not {op}GetWorkspaceSize"
                )
            }
            Some(e) => e,
        }
    };
    let need = ex.plan.workspace;
    let mut reqs = ex.plan.reqs;
    if need > 0 {
        if ws_size < need {
            bail!(
                Workspace,
                "{op}: workspaceSize {ws_size} is smaller than the {need} bytes {op}GetWorkspaceSize asked for"
            );
        }
        if workspace == 0 {
            bail!(
                Workspace,
                "{op}: workspace is null but {need} bytes were asked for"
            );
        }
        reqs.push(AccessReq::write(workspace, need, "workspace"));
    }
    let run = ex
        .plan
        .run
        .ok_or_else(|| emu_err!(Internal, "{op}: the plan has no computation"))?;
    stream::submit(op, op, &s, &reqs, move |res| {
        Box::new(move || {
            if need > 0 {
                // The workspace is the last region asked for: scribbled over, as a card leaves
                // it, so an op that reads it before writing computes garbage.
                if let Some(w) = res.last() {
                    crate::mem::write_bytes(w, &vec![SCRIBBLE; w.len]);
                }
            }
            run(&res)
        })
    })
}
