//! Strategy search by dynamic programming (being written).
