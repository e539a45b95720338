//! `shardc-backend-cpu`: CPU kernels for every op of the IR.
