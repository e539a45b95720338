//! Every aclnn op of the emulator against a tiny hand-computed case, through the exported
//! two-phase functions (GetWorkspaceSize, then the launch on a stream).
#![allow(clippy::macro_metavars_in_unsafe)]

mod common;

use common::*;
use shardc_ascend_emulator::aclnn::*;
use shardc_ascend_emulator::ffi::ACLNN_ERR_PARAM_INVALID;
use shardc_ascend_sys as sys;

const E: f32 = 1e-6;

#[test]
fn add_sub_mul_div_broadcast() {
    setup(0);
    let a = dev(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
    let b = dev(&[10., 20., 30.], &[3]);
    let o = zeros(&[2, 3]);
    run_op!(
        aclnnAdd,
        aclnnAddGetWorkspaceSize(a.t, b.t, scalar(2.0), o.t)
    );
    close(&o.f32(), &[21., 42., 63., 24., 45., 66.], E);
    let c = dev(&[1., 2.], &[2, 1]);
    run_op!(
        aclnnSub,
        aclnnSubGetWorkspaceSize(c.t, b.t, scalar(1.0), o.t)
    );
    close(&o.f32(), &[-9., -19., -29., -8., -18., -28.], E);
    let two = dev(&[2.], &[1]);
    run_op!(aclnnMul, aclnnMulGetWorkspaceSize(a.t, two.t, o.t));
    close(&o.f32(), &[2., 4., 6., 8., 10., 12.], E);
    run_op!(aclnnDiv, aclnnDivGetWorkspaceSize(a.t, b.t, o.t));
    close(&o.f32(), &[0.1, 0.1, 0.1, 0.4, 0.25, 0.2], E);
    let small = zeros(&[3]);
    assert_eq!(
        prep_status!(aclnnAddGetWorkspaceSize(a.t, b.t, scalar(1.0), small.t)),
        ACLNN_ERR_PARAM_INVALID
    );
}

#[test]
fn scalar_ops() {
    setup(0);
    let a = dev(&[1., -2.], &[2]);
    let o = zeros(&[2]);
    run_op!(
        aclnnAdds,
        aclnnAddsGetWorkspaceSize(a.t, scalar(3.0), scalar(2.0), o.t)
    );
    close(&o.f32(), &[7., 4.], E);
    run_op!(aclnnMuls, aclnnMulsGetWorkspaceSize(a.t, scalar(0.5), o.t));
    close(&o.f32(), &[0.5, -1.], E);
    run_op!(
        aclnnInplaceFillScalar,
        aclnnInplaceFillScalarGetWorkspaceSize(o.t, scalar(4.5))
    );
    close(&o.f32(), &[4.5, 4.5], E);
    run_op!(aclnnInplaceZero, aclnnInplaceZeroGetWorkspaceSize(o.t));
    close(&o.f32(), &[0., 0.], E);
}

#[test]
fn unary_math() {
    setup(0);
    let cases: [(&str, [f32; 2], [f32; 2]); 7] = [
        ("neg", [1., -2.], [-1., 2.]),
        ("sqrt", [4., 9.], [2., 3.]),
        ("exp", [0., 1.], [1., std::f32::consts::E]),
        ("log", [1., std::f32::consts::E], [0., 1.]),
        ("tanh", [0., 0.5], [0., 0.462_117_16]),
        ("relu", [-1., 2.], [0., 2.]),
        ("sigmoid", [0., 1.], [0.5, 0.731_058_6]),
    ];
    for (name, x, want) in cases {
        let a = dev(&x, &[2]);
        let o = zeros(&[2]);
        match name {
            "neg" => run_op!(aclnnNeg, aclnnNegGetWorkspaceSize(a.t, o.t)),
            "sqrt" => run_op!(aclnnSqrt, aclnnSqrtGetWorkspaceSize(a.t, o.t)),
            "exp" => run_op!(aclnnExp, aclnnExpGetWorkspaceSize(a.t, o.t)),
            "log" => run_op!(aclnnLog, aclnnLogGetWorkspaceSize(a.t, o.t)),
            "tanh" => run_op!(aclnnTanh, aclnnTanhGetWorkspaceSize(a.t, o.t)),
            "relu" => run_op!(aclnnRelu, aclnnReluGetWorkspaceSize(a.t, o.t)),
            _ => run_op!(aclnnSigmoid, aclnnSigmoidGetWorkspaceSize(a.t, o.t)),
        };
        close(&o.f32(), &want, E);
    }
}

#[test]
fn activations_and_their_gradients() {
    setup(0);
    let x = dev(&[1., -0.5], &[2]);
    let o = zeros(&[2]);
    run_op!(aclnnGeluV2, aclnnGeluV2GetWorkspaceSize(x.t, 1, o.t));
    close(&o.f32(), &[0.841_192, -0.154_286], 1e-6);
    run_op!(aclnnGeluV2, aclnnGeluV2GetWorkspaceSize(x.t, 0, o.t));
    close(&o.f32()[..1], &[0.841_344_7], 1e-6);
    let g = dev(&[1., 1.], &[2]);
    let mut tanh = *b"tanh\0";
    run_op!(
        aclnnGeluBackwardV2,
        aclnnGeluBackwardV2GetWorkspaceSize(g.t, x.t, tanh.as_mut_ptr() as *mut i8, o.t)
    );
    close(&o.f32(), &[1.082_964, 0.132_630_1], 1e-6);
    let mut none = *b"none\0";
    run_op!(
        aclnnGeluBackwardV2,
        aclnnGeluBackwardV2GetWorkspaceSize(g.t, x.t, none.as_mut_ptr() as *mut i8, o.t)
    );
    close(&o.f32()[..1], &[1.083_315_5], 1e-6);
    let one = dev(&[1., 0.], &[2]);
    run_op!(aclnnSilu, aclnnSiluGetWorkspaceSize(one.t, o.t));
    close(&o.f32(), &[0.731_058_6, 0.], 1e-6);
    run_op!(aclnnErf, aclnnErfGetWorkspaceSize(one.t, o.t));
    close(&o.f32(), &[0.842_700_8, 0.], 1e-6);
    run_op!(
        aclnnSiluBackward,
        aclnnSiluBackwardGetWorkspaceSize(g.t, one.t, o.t)
    );
    close(&o.f32(), &[0.927_670_5, 0.5], 1e-6);
    let y = dev(&[0.5, 0.], &[2]);
    let g2 = dev(&[1., 2.], &[2]);
    run_op!(
        aclnnSigmoidBackward,
        aclnnSigmoidBackwardGetWorkspaceSize(g2.t, y.t, o.t)
    );
    close(&o.f32(), &[0.25, 0.], E);
    run_op!(
        aclnnTanhBackward,
        aclnnTanhBackwardGetWorkspaceSize(g2.t, y.t, o.t)
    );
    close(&o.f32(), &[0.75, 2.], E);
    let g3 = dev(&[1., 2., 3.], &[3]);
    let x3 = dev(&[-1., 0., 1.], &[3]);
    let o3 = zeros(&[3]);
    run_op!(
        aclnnThresholdBackward,
        aclnnThresholdBackwardGetWorkspaceSize(g3.t, x3.t, scalar(0.0), o3.t)
    );
    close(&o3.f32(), &[0., 0., 3.], E);
}

#[test]
fn casts_and_comparisons() {
    setup(0);
    let a = dev(&[1.7, -1.7, 0.], &[3]);
    let i = zeros_of(&[3], sys::ACL_INT32);
    run_op!(
        aclnnCast,
        aclnnCastGetWorkspaceSize(a.t, sys::ACL_INT32, i.t)
    );
    assert_eq!(i.i32(), vec![1, -1, 0]);
    let b = zeros_of(&[3], sys::ACL_BOOL);
    run_op!(
        aclnnCast,
        aclnnCastGetWorkspaceSize(a.t, sys::ACL_BOOL, b.t)
    );
    assert_eq!(b.raw(), vec![1, 1, 0]);
    let h = zeros_of(&[3], sys::ACL_FLOAT16);
    run_op!(
        aclnnCast,
        aclnnCastGetWorkspaceSize(a.t, sys::ACL_FLOAT16, h.t)
    );
    assert_eq!(&h.raw()[..2], &0x3ecdu16.to_le_bytes(), "1.7 as f16");
    let back = zeros(&[3]);
    run_op!(
        aclnnCast,
        aclnnCastGetWorkspaceSize(h.t, sys::ACL_FLOAT, back.t)
    );
    close(&back.f32(), &[1.700_195_3, -1.700_195_3, 0.], 1e-7);
    let l = dev_i64(&[1 << 40, -3], &[2]);
    let l2 = zeros_of(&[2], sys::ACL_INT64);
    run_op!(
        aclnnCast,
        aclnnCastGetWorkspaceSize(l.t, sys::ACL_INT64, l2.t)
    );
    assert_eq!(l2.i64(), vec![1 << 40, -3]);
    assert_eq!(
        prep_status!(aclnnCastGetWorkspaceSize(a.t, sys::ACL_INT64, i.t)),
        ACLNN_ERR_PARAM_INVALID
    );
    let c = dev(&[1., 5., 3.], &[3]);
    let d = dev(&[1., 2., 3.], &[3]);
    run_op!(aclnnEqTensor, aclnnEqTensorGetWorkspaceSize(c.t, d.t, b.t));
    assert_eq!(b.raw(), vec![1, 0, 1]);
    // f16 arithmetic converts in and out.
    let hs = zeros_of(&[3], sys::ACL_FLOAT16);
    run_op!(
        aclnnAdd,
        aclnnAddGetWorkspaceSize(h.t, h.t, scalar(1.0), hs.t)
    );
    run_op!(
        aclnnCast,
        aclnnCastGetWorkspaceSize(hs.t, sys::ACL_FLOAT, back.t)
    );
    close(&back.f32(), &[3.400_390_6, -3.400_390_6, 0.], 1e-7);
}

#[test]
fn reductions_ask_for_a_workspace() {
    setup(0);
    let a = dev(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
    let o = zeros(&[2]);
    let ws = run_op!(
        aclnnReduceSum,
        aclnnReduceSumGetWorkspaceSize(a.t, ints(&[1]), false, sys::ACL_FLOAT, o.t)
    );
    assert!(ws > 0);
    close(&o.f32(), &[6., 15.], E);
    let k = zeros(&[1, 3]);
    run_op!(
        aclnnReduceSum,
        aclnnReduceSumGetWorkspaceSize(a.t, ints(&[-2]), true, sys::ACL_FLOAT, k.t)
    );
    close(&k.f32(), &[5., 7., 9.], E);
    let s = zeros(&[]);
    run_op!(
        aclnnMean,
        aclnnMeanGetWorkspaceSize(a.t, ints(&[]), false, sys::ACL_FLOAT, s.t)
    );
    close(&s.f32(), &[3.5], E);
    let m = zeros(&[2, 1]);
    run_op!(
        aclnnAmax,
        aclnnAmaxGetWorkspaceSize(a.t, ints(&[1]), true, m.t)
    );
    close(&m.f32(), &[3., 6.], E);
    assert_eq!(
        prep_status!(aclnnAmaxGetWorkspaceSize(a.t, ints(&[1]), false, m.t)),
        ACLNN_ERR_PARAM_INVALID
    );
    assert_eq!(
        prep_status!(aclnnAmaxGetWorkspaceSize(a.t, ints(&[2]), false, o.t)),
        ACLNN_ERR_PARAM_INVALID
    );
}

#[test]
fn softmax_family() {
    setup(0);
    let x = dev(&[1., 2., 3., 3.], &[2, 2]);
    let o = zeros(&[2, 2]);
    run_op!(aclnnSoftmax, aclnnSoftmaxGetWorkspaceSize(x.t, -1, o.t));
    close(&o.f32(), &[0.268_941_43, 0.731_058_6, 0.5, 0.5], 1e-6);
    run_op!(
        aclnnLogSoftmax,
        aclnnLogSoftmaxGetWorkspaceSize(x.t, 1, o.t)
    );
    close(
        &o.f32(),
        &[
            -1.313_261_7,
            -0.313_261_7,
            -std::f32::consts::LN_2,
            -std::f32::consts::LN_2,
        ],
        1e-6,
    );
    let y = dev(&[0.5, 0.5], &[2]);
    let g = dev(&[1., 0.], &[2]);
    let d = zeros(&[2]);
    run_op!(
        aclnnSoftmaxBackward,
        aclnnSoftmaxBackwardGetWorkspaceSize(g.t, y.t, 0, d.t)
    );
    close(&d.f32(), &[0.25, -0.25], E);
    let ly = dev(&[-std::f32::consts::LN_2, -std::f32::consts::LN_2], &[2]);
    run_op!(
        aclnnLogSoftmaxBackward,
        aclnnLogSoftmaxBackwardGetWorkspaceSize(g.t, ly.t, 0, d.t)
    );
    close(&d.f32(), &[0.5, -0.5], 1e-6);
    // Softmax along axis 0 of a [2, 2].
    run_op!(aclnnSoftmax, aclnnSoftmaxGetWorkspaceSize(x.t, 0, o.t));
    close(
        &o.f32(),
        &[0.119_202_92, 0.268_941_43, 0.880_797_1, 0.731_058_6],
        1e-6,
    );
}

#[test]
fn layer_norm_forward_and_backward() {
    setup(0);
    let x = dev(&[1., 3.], &[1, 2]);
    let w = dev(&[1., 2.], &[2]);
    let b = dev(&[0., 1.], &[2]);
    let (o, m, r) = (zeros(&[1, 2]), zeros(&[1, 1]), zeros(&[1, 1]));
    run_op!(
        aclnnLayerNorm,
        aclnnLayerNormGetWorkspaceSize(x.t, ints(&[2]), w.t, b.t, 0.0, o.t, m.t, r.t)
    );
    close(&o.f32(), &[-1., 3.], 1e-6);
    close(&m.f32(), &[2.], E);
    close(&r.f32(), &[1.], E);
    let x3 = dev(&[0., 1., 2.], &[1, 3]);
    let g3 = dev(&[1., 0., 0.], &[1, 3]);
    let (m3, r3) = (dev(&[1.], &[1, 1]), dev(&[1.224_744_9], &[1, 1]));
    let (dx, dw, db) = (zeros(&[1, 3]), zeros(&[3]), zeros(&[3]));
    let mask = bools(&[true, true, true]);
    run_op!(
        aclnnLayerNormBackward,
        aclnnLayerNormBackwardGetWorkspaceSize(
            g3.t,
            x3.t,
            ints(&[3]),
            m3.t,
            r3.t,
            std::ptr::null(),
            std::ptr::null(),
            mask,
            dx.t,
            dw.t,
            db.t
        )
    );
    close(&dx.f32(), &[0.204_124_1, -0.408_248_3, 0.204_124_1], 1e-6);
    close(&dw.f32(), &[-1.224_744_9, 0., 0.], 1e-6);
    close(&db.f32(), &[1., 0., 0.], E);
    // Only the input gradient: the others may be null.
    run_op!(
        aclnnLayerNormBackward,
        aclnnLayerNormBackwardGetWorkspaceSize(
            g3.t,
            x3.t,
            ints(&[3]),
            m3.t,
            r3.t,
            std::ptr::null(),
            std::ptr::null(),
            bools(&[true, false, false]),
            dx.t,
            std::ptr::null_mut(),
            std::ptr::null_mut()
        )
    );
    let bad = zeros(&[1, 2]);
    assert_eq!(
        prep_status!(aclnnLayerNormGetWorkspaceSize(
            x3.t,
            ints(&[2]),
            std::ptr::null(),
            std::ptr::null(),
            0.0,
            bad.t,
            std::ptr::null_mut(),
            std::ptr::null_mut()
        )),
        ACLNN_ERR_PARAM_INVALID
    );
}

#[test]
fn batch_norm_training_eval_and_backward() {
    setup(0);
    let x = dev(&[1., 3.], &[2, 1]);
    let (w, b) = (dev(&[2.], &[1]), dev(&[1.], &[1]));
    let (rm, rv) = (dev(&[0.], &[1]), dev(&[1.], &[1]));
    let (o, sm, si) = (zeros(&[2, 1]), zeros(&[1]), zeros(&[1]));
    let ws = run_op!(
        aclnnBatchNorm,
        aclnnBatchNormGetWorkspaceSize(x.t, w.t, b.t, rm.t, rv.t, true, 0.1, 0.0, o.t, sm.t, si.t)
    );
    assert!(ws > 0);
    close(&o.f32(), &[-1., 3.], 1e-6);
    close(&rm.f32(), &[0.2], 1e-6);
    close(&rv.f32(), &[1.1], 1e-6);
    close(&sm.f32(), &[2.], E);
    close(&si.f32(), &[1.], E);
    let (em, ev) = (dev(&[2.], &[1]), dev(&[4.], &[1]));
    run_op!(
        aclnnBatchNorm,
        aclnnBatchNormGetWorkspaceSize(
            x.t,
            std::ptr::null(),
            std::ptr::null(),
            em.t,
            ev.t,
            false,
            0.1,
            0.0,
            o.t,
            std::ptr::null_mut(),
            std::ptr::null_mut()
        )
    );
    close(&o.f32(), &[-0.5, 0.5], 1e-6);
    let x3 = dev(&[0., 1., 2.], &[3, 1, 1, 1]);
    let g3 = dev(&[1., 0., 0.], &[3, 1, 1, 1]);
    let (m3, i3, w1) = (
        dev(&[1.], &[1]),
        dev(&[1.224_744_9], &[1]),
        dev(&[1.], &[1]),
    );
    let (dx, dw, db) = (zeros(&[3, 1, 1, 1]), zeros(&[1]), zeros(&[1]));
    run_op!(
        aclnnBatchNormBackward,
        aclnnBatchNormBackwardGetWorkspaceSize(
            g3.t,
            x3.t,
            w1.t,
            std::ptr::null(),
            std::ptr::null(),
            m3.t,
            i3.t,
            true,
            0.0,
            bools(&[true, true, true]),
            dx.t,
            dw.t,
            db.t
        )
    );
    close(&dx.f32(), &[0.204_124_1, -0.408_248_3, 0.204_124_1], 1e-6);
    close(&dw.f32(), &[-1.224_744_9], 1e-6);
    close(&db.f32(), &[1.], E);
    // Eval backward: gradOut·w/√(var+eps).
    run_op!(
        aclnnBatchNormBackward,
        aclnnBatchNormBackwardGetWorkspaceSize(
            g3.t,
            x3.t,
            w1.t,
            em.t,
            ev.t,
            std::ptr::null(),
            std::ptr::null(),
            false,
            0.0,
            bools(&[true, false, false]),
            dx.t,
            std::ptr::null_mut(),
            std::ptr::null_mut()
        )
    );
    close(&dx.f32(), &[0.5, 0., 0.], E);
}

#[test]
fn convolution_forward_and_backward() {
    setup(0);
    let x = dev(&[1., 2., 3., 4., 5., 6., 7., 8., 9.], &[1, 1, 3, 3]);
    let w = dev(&[1., 0., 0., 1.], &[1, 1, 2, 2]);
    let b = dev(&[10.], &[1]);
    let o = zeros(&[1, 1, 2, 2]);
    let ws = run_op!(
        aclnnConvolution,
        aclnnConvolutionGetWorkspaceSize(
            x.t,
            w.t,
            b.t,
            ints(&[1, 1]),
            ints(&[0, 0]),
            ints(&[1, 1]),
            false,
            ints(&[0, 0]),
            1,
            o.t,
            0
        )
    );
    assert!(ws > 0);
    close(&o.f32(), &[16., 18., 22., 24.], E);
    run_op!(
        aclnnConvolution,
        aclnnConvolutionGetWorkspaceSize(
            x.t,
            w.t,
            b.t,
            ints(&[2, 2]),
            ints(&[1, 1]),
            ints(&[1, 1]),
            false,
            ints(&[0, 0]),
            1,
            o.t,
            0
        )
    );
    close(&o.f32(), &[11., 13., 17., 24.], E);
    let g = dev(&[1., 1., 1., 1.], &[1, 1, 2, 2]);
    let (dx, dw, db) = (zeros(&[1, 1, 3, 3]), zeros(&[1, 1, 2, 2]), zeros(&[1]));
    run_op!(
        aclnnConvolutionBackward,
        aclnnConvolutionBackwardGetWorkspaceSize(
            g.t,
            x.t,
            w.t,
            ints(&[1]),
            ints(&[1, 1]),
            ints(&[0, 0]),
            ints(&[1, 1]),
            false,
            ints(&[0, 0]),
            1,
            bools(&[true, true, true]),
            0,
            dx.t,
            dw.t,
            db.t
        )
    );
    close(&dx.f32(), &[1., 1., 0., 1., 2., 1., 0., 1., 1.], E);
    close(&dw.f32(), &[12., 16., 24., 28.], E);
    close(&db.f32(), &[4.], E);
    // Groups: two channels, each with its own 1x1 filter.
    let x2 = dev(&[1., 2., 3., 4.], &[1, 2, 1, 2]);
    let w2 = dev(&[2., 3.], &[2, 1, 1, 1]);
    let o2 = zeros(&[1, 2, 1, 2]);
    run_op!(
        aclnnConvolution,
        aclnnConvolutionGetWorkspaceSize(
            x2.t,
            w2.t,
            std::ptr::null(),
            ints(&[1, 1]),
            ints(&[0, 0]),
            ints(&[1, 1]),
            false,
            ints(&[0, 0]),
            2,
            o2.t,
            0
        )
    );
    close(&o2.f32(), &[2., 4., 9., 12.], E);
    let bad = zeros(&[1, 1, 3, 3]);
    assert_eq!(
        prep_status!(aclnnConvolutionGetWorkspaceSize(
            x.t,
            w.t,
            b.t,
            ints(&[1, 1]),
            ints(&[0, 0]),
            ints(&[1, 1]),
            false,
            ints(&[0, 0]),
            1,
            bad.t,
            0
        )),
        ACLNN_ERR_PARAM_INVALID
    );
}

#[test]
fn pooling_forward_and_backward() {
    setup(0);
    let x = dev(&[1., 2., 3., 4.], &[1, 1, 2, 2]);
    let o = zeros(&[1, 1, 1, 1]);
    run_op!(
        aclnnAvgPool2d,
        aclnnAvgPool2dGetWorkspaceSize(
            x.t,
            ints(&[2, 2]),
            ints(&[2, 2]),
            ints(&[0, 0]),
            false,
            true,
            0,
            0,
            o.t
        )
    );
    close(&o.f32(), &[2.5], E);
    let o4 = zeros(&[1, 1, 2, 2]);
    run_op!(
        aclnnAvgPool2d,
        aclnnAvgPool2dGetWorkspaceSize(
            x.t,
            ints(&[2, 2]),
            ints(&[2, 2]),
            ints(&[1, 1]),
            false,
            false,
            0,
            0,
            o4.t
        )
    );
    close(&o4.f32(), &[1., 2., 3., 4.], E);
    run_op!(
        aclnnAvgPool2d,
        aclnnAvgPool2dGetWorkspaceSize(
            x.t,
            ints(&[2, 2]),
            ints(&[2, 2]),
            ints(&[1, 1]),
            false,
            true,
            0,
            0,
            o4.t
        )
    );
    close(&o4.f32(), &[0.25, 0.5, 0.75, 1.], E);
    let g = dev(&[4.], &[1, 1, 1, 1]);
    let dx = zeros(&[1, 1, 2, 2]);
    run_op!(
        aclnnAvgPool2dBackward,
        aclnnAvgPool2dBackwardGetWorkspaceSize(
            g.t,
            x.t,
            ints(&[2, 2]),
            ints(&[2, 2]),
            ints(&[0, 0]),
            false,
            true,
            0,
            0,
            dx.t
        )
    );
    close(&dx.f32(), &[1., 1., 1., 1.], E);
    let m = dev(&[1., 5., 2., 4., 3., 6.], &[1, 1, 2, 3]);
    let mo = zeros(&[1, 1, 1, 2]);
    let mi = zeros_of(&[1, 1, 1, 2], sys::ACL_INT32);
    run_op!(
        aclnnMaxPool2dWithIndices,
        aclnnMaxPool2dWithIndicesGetWorkspaceSize(
            m.t,
            ints(&[2, 2]),
            ints(&[1, 1]),
            ints(&[0, 0]),
            ints(&[1, 1]),
            false,
            mo.t,
            mi.t
        )
    );
    close(&mo.f32(), &[5., 6.], E);
    assert_eq!(mi.i32(), vec![1, 5]);
    let mg = dev(&[1., 2.], &[1, 1, 1, 2]);
    let mdx = zeros(&[1, 1, 2, 3]);
    run_op!(
        aclnnMaxPool2dWithIndicesBackward,
        aclnnMaxPool2dWithIndicesBackwardGetWorkspaceSize(
            mg.t,
            m.t,
            mi.t,
            ints(&[2, 2]),
            ints(&[1, 1]),
            ints(&[0, 0]),
            ints(&[1, 1]),
            false,
            mdx.t
        )
    );
    close(&mdx.f32(), &[0., 1., 0., 0., 0., 2.], E);
    // ceil mode: 3 wide with kernel 2 stride 2 gives 2 outputs, the second a partial window.
    let c = zeros(&[1, 1, 1, 2]);
    let ci = zeros_of(&[1, 1, 1, 2], sys::ACL_INT64);
    let row = dev(&[1., 5., 2., 4., 3., 6.], &[1, 1, 2, 3]);
    run_op!(
        aclnnMaxPool2dWithIndices,
        aclnnMaxPool2dWithIndicesGetWorkspaceSize(
            row.t,
            ints(&[2, 2]),
            ints(&[2, 2]),
            ints(&[0, 0]),
            ints(&[1, 1]),
            true,
            c.t,
            ci.t
        )
    );
    close(&c.f32(), &[5., 6.], E);
    assert_eq!(ci.i64(), vec![1, 5]);
}

#[test]
fn matmul_with_strided_transposed_and_batched_operands() {
    setup(0);
    let a = dev(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
    let b = dev(&[1., 0., 0., 1., 1., 1.], &[3, 2]);
    let o = zeros(&[2, 2]);
    let ws = run_op!(aclnnMatmul, aclnnMatmulGetWorkspaceSize(a.t, b.t, o.t, 0));
    assert!(ws > 0);
    close(&o.f32(), &[4., 5., 10., 11.], E);
    // aᵀ as a strided view of a [3, 2] buffer: view [2, 3] with strides [1, 2].
    let s = dev(&[1., 2., 3., 4., 5., 6.], &[3, 2]);
    let st = tensor(s.ptr, &[2, 3], &[1, 2], 0, sys::ACL_FLOAT, 6);
    let b2 = dev(&[1., 0., 0., 1., 0., 0.], &[3, 2]);
    // The output written through a transposed view too.
    let ot = zeros(&[2, 2]);
    let otv = tensor(ot.ptr, &[2, 2], &[1, 2], 0, sys::ACL_FLOAT, 4);
    run_op!(aclnnMatmul, aclnnMatmulGetWorkspaceSize(st, b2.t, otv, 0));
    // aᵀ·b2 = [[1, 3], [2, 4]], stored transposed.
    close(&ot.f32(), &[1., 2., 3., 4.], E);
    // Batch broadcast: [2, 2, 3] · [3, 1].
    let ab = dev(
        &[1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11., 12.],
        &[2, 2, 3],
    );
    let v = dev(&[1., 1., 1.], &[3, 1]);
    let ob = zeros(&[2, 2, 1]);
    run_op!(aclnnMatmul, aclnnMatmulGetWorkspaceSize(ab.t, v.t, ob.t, 0));
    close(&ob.f32(), &[6., 15., 24., 33.], E);
    // A view with an offset: rows 1.. of a [3, 2] buffer.
    let off = tensor(s.ptr, &[2, 2], &[2, 1], 2, sys::ACL_FLOAT, 6);
    let eye = dev(&[1., 0., 0., 1.], &[2, 2]);
    run_op!(aclnnMatmul, aclnnMatmulGetWorkspaceSize(off, eye.t, o.t, 0));
    close(&o.f32(), &[3., 4., 5., 6.], E);
    let bb = dev(&[1., 2., 3., 4.], &[2, 1, 2]);
    let bv = dev(&[1., 1., 2., 0.], &[2, 2, 1]);
    let bo = zeros(&[2, 1, 1]);
    run_op!(
        aclnnBatchMatMul,
        aclnnBatchMatMulGetWorkspaceSize(bb.t, bv.t, bo.t, 0)
    );
    close(&bo.f32(), &[3., 6.], E);
    assert_eq!(
        prep_status!(aclnnMatmulGetWorkspaceSize(a.t, a.t, o.t, 0)),
        ACLNN_ERR_PARAM_INVALID
    );
    assert_eq!(
        prep_status!(aclnnBatchMatMulGetWorkspaceSize(a.t, b.t, o.t, 0)),
        ACLNN_ERR_PARAM_INVALID
    );
}

#[test]
fn movement_ops() {
    setup(0);
    let a = dev(&[1., 2., 3., 4., 5., 6.], &[2, 3]);
    let p = zeros(&[3, 2]);
    run_op!(
        aclnnPermute,
        aclnnPermuteGetWorkspaceSize(a.t, ints(&[1, 0]), p.t)
    );
    close(&p.f32(), &[1., 4., 2., 5., 3., 6.], E);
    let v = dev(&[1., 2., 3.], &[3]);
    let e = zeros(&[2, 3]);
    run_op!(
        aclnnExpand,
        aclnnExpandGetWorkspaceSize(v.t, ints(&[2, 3]), e.t)
    );
    close(&e.f32(), &[1., 2., 3., 1., 2., 3.], E);
    let c1 = dev(&[1., 2.], &[1, 2]);
    let c2 = dev(&[3., 4., 5., 6.], &[2, 2]);
    let list = unsafe {
        shardc_ascend_emulator::nnopbase::aclCreateTensorList(
            [c1.t as *const sys::aclTensor, c2.t].as_ptr(),
            2,
        )
    };
    let c = zeros(&[3, 2]);
    run_op!(aclnnCat, aclnnCatGetWorkspaceSize(list, 0, c.t));
    close(&c.f32(), &[1., 2., 3., 4., 5., 6.], E);
    let c3 = dev(&[7., 8.], &[2, 1]);
    let list2 = unsafe {
        shardc_ascend_emulator::nnopbase::aclCreateTensorList(
            [c2.t as *const sys::aclTensor, c3.t].as_ptr(),
            2,
        )
    };
    let cc = zeros(&[2, 3]);
    run_op!(aclnnCat, aclnnCatGetWorkspaceSize(list2, -1, cc.t));
    close(&cc.f32(), &[3., 4., 7., 5., 6., 8.], E);
    // InplaceCopy: broadcast a row into a transposed destination view.
    let d = zeros(&[2, 2]);
    let dt = tensor(d.ptr, &[2, 2], &[1, 2], 0, sys::ACL_FLOAT, 4);
    let row = dev(&[1., 2.], &[2]);
    run_op!(
        aclnnInplaceCopy,
        aclnnInplaceCopyGetWorkspaceSize(dt, row.t)
    );
    close(&d.f32(), &[1., 1., 2., 2.], E);
    // A view with an offset.
    let src = dev(&[7., 8., 9.], &[3]);
    let tail = tensor(src.ptr, &[2], &[1], 1, sys::ACL_FLOAT, 3);
    let n = zeros(&[2]);
    run_op!(aclnnNeg, aclnnNegGetWorkspaceSize(tail, n.t));
    close(&n.f32(), &[-8., -9.], E);
}

#[test]
fn indexing_ops() {
    setup(0);
    let x = dev(&[1., 2., 3., 4., 5., 6.], &[3, 2]);
    let i = dev_i64(&[2, 0], &[2]);
    let o = zeros(&[2, 2]);
    run_op!(
        aclnnIndexSelect,
        aclnnIndexSelectGetWorkspaceSize(x.t, 0, i.t, o.t)
    );
    close(&o.f32(), &[5., 6., 1., 2.], E);
    let j = dev_i32(&[1], &[1]);
    let o2 = zeros(&[3, 1]);
    run_op!(
        aclnnIndexSelect,
        aclnnIndexSelectGetWorkspaceSize(x.t, 1, j.t, o2.t)
    );
    close(&o2.f32(), &[2., 4., 6.], E);
    let z = zeros(&[3]);
    let k = dev_i64(&[0, 0, 2], &[3]);
    let s = dev(&[1., 2., 3.], &[3]);
    let out = zeros(&[3]);
    run_op!(
        aclnnIndexAdd,
        aclnnIndexAddGetWorkspaceSize(z.t, 0, k.t, s.t, scalar(2.0), out.t)
    );
    close(&out.f32(), &[6., 0., 6.], E);
    let lab = dev_i64(&[0, 2, 5], &[3]);
    let (on, off) = (dev(&[1.], &[1]), dev(&[0.], &[1]));
    let oh = zeros(&[3, 3]);
    run_op!(
        aclnnOneHot,
        aclnnOneHotGetWorkspaceSize(lab.t, 3, on.t, off.t, -1, oh.t)
    );
    close(&oh.f32(), &[1., 0., 0., 0., 0., 1., 0., 0., 0.], E);
    let oh0 = zeros(&[3, 3]);
    run_op!(
        aclnnOneHot,
        aclnnOneHotGetWorkspaceSize(lab.t, 3, on.t, off.t, 0, oh0.t)
    );
    close(&oh0.f32(), &[1., 0., 0., 0., 0., 0., 0., 1., 0.], E);
    let fl = dev(&[0.], &[1]);
    assert_eq!(
        prep_status!(aclnnIndexSelectGetWorkspaceSize(x.t, 0, fl.t, o.t)),
        ACLNN_ERR_PARAM_INVALID
    );
}

#[test]
fn a_workspace_aliasing_live_data_corrupts_it() {
    // The emulator scribbles over the workspace, as a real kernel may: a backend that hands
    // out live memory as workspace sees wrong results, not silently right ones.
    setup(0);
    let a = dev(&[1., 2., 3., 4.], &[2, 2]);
    let o = zeros(&[2, 2]);
    let mut size = 0u64;
    let mut ex = std::ptr::null_mut();
    assert_eq!(
        unsafe { aclnnMatmulGetWorkspaceSize(a.t, a.t, o.t, 0, &mut size, &mut ex) },
        0
    );
    let w = malloc(size as usize);
    let keep = vec![1u8; size as usize];
    h2d(w, &keep);
    assert_eq!(unsafe { aclnnMatmul(w, size, ex, std::ptr::null_mut()) }, 0);
    sync();
    assert_ne!(d2h(w, size as usize), keep);
    close(&o.f32(), &[7., 10., 15., 22.], E);
}

#[test]
fn dilation_divisor_override_and_bf16() {
    setup(0);
    let x = dev(&[1., 2., 3., 4., 5., 6., 7., 8., 9.], &[1, 1, 3, 3]);
    let w = dev(&[1., 0., 0., 1.], &[1, 1, 2, 2]);
    let o = zeros(&[1, 1, 1, 1]);
    run_op!(
        aclnnConvolution,
        aclnnConvolutionGetWorkspaceSize(
            x.t,
            w.t,
            std::ptr::null(),
            ints(&[1, 1]),
            ints(&[0, 0]),
            ints(&[2, 2]),
            false,
            ints(&[0, 0]),
            1,
            o.t,
            0
        )
    );
    close(&o.f32(), &[10.], E);
    let mi = zeros_of(&[1, 1, 1, 1], sys::ACL_INT32);
    run_op!(
        aclnnMaxPool2dWithIndices,
        aclnnMaxPool2dWithIndicesGetWorkspaceSize(
            x.t,
            ints(&[2, 2]),
            ints(&[1, 1]),
            ints(&[0, 0]),
            ints(&[2, 2]),
            false,
            o.t,
            mi.t
        )
    );
    close(&o.f32(), &[9.], E);
    assert_eq!(mi.i32(), vec![8]);
    let x2 = dev(&[1., 2., 3., 4.], &[1, 1, 2, 2]);
    run_op!(
        aclnnAvgPool2d,
        aclnnAvgPool2dGetWorkspaceSize(
            x2.t,
            ints(&[2, 2]),
            ints(&[2, 2]),
            ints(&[0, 0]),
            false,
            true,
            2,
            0,
            o.t
        )
    );
    close(&o.f32(), &[5.], E);
    let a = dev(&[1.0, -2.5, 3.140_625], &[3]);
    let b = zeros_of(&[3], sys::ACL_BF16);
    run_op!(
        aclnnCast,
        aclnnCastGetWorkspaceSize(a.t, sys::ACL_BF16, b.t)
    );
    assert_eq!(&b.raw()[..2], &0x3f80u16.to_le_bytes());
    let back = zeros(&[3]);
    run_op!(
        aclnnCast,
        aclnnCastGetWorkspaceSize(b.t, sys::ACL_FLOAT, back.t)
    );
    close(&back.f32(), &[1.0, -2.5, 3.140_625], 0.0);
}
