//! Exact strategy search by integer programming (being written).
