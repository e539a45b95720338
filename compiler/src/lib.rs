//! `shardc-compiler`: the frontend that builds logical graphs and the pipeline that compiles
//! them into per-rank artifacts.
