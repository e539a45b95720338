//! The drawn graph: the boxes of [`super::model::Folded`] laid out by `layout-rs` (a
//! dot-like layered layout: ranks, crossing reduction, edge routing) and written as SVG.
//!
//! Each box is an SVG group `class="box SPLIT" data-box="K"` (K its index in the folded
//! graph), filled with its split's colour; an edge with communication is drawn
//! `class="comm"` with a stroke width that grows with the bytes sent per step, and labelled
//! (`AllReduce 4.0 MiB`).

use super::model::{box_edges, BoxEdge, Folded, Shown, StepGraph};
use anyhow::{bail, Result};
use layout::backends::svg::SVGWriter;
use layout::core::base::Orientation;
use layout::core::color::Color;
use layout::core::style::{LineStyleKind, StyleAttr};
use layout::std_shapes::render::get_shape_size;
use layout::std_shapes::shapes::{Arrow, Element, LineEndKind, ShapeKind};
use layout::topo::layout::VisualGraph;

/// The font size of the boxes' labels.
const FONT: usize = 12;

/// A box's label: `name · Kind` and its strategy, or a fold's label.
pub fn box_label(s: &StepGraph, f: &Folded, b: usize) -> String {
    match &f.shown[b] {
        Shown::Op(k) => {
            let op = &s.ops[*k];
            format!("{} · {}\n{}", op.name, op.kind.name(), op.strategy)
        }
        Shown::Folded(fold) => format!("{}\n{} ops", fold.label(s.cell.as_ref()), fold.ops.len()),
    }
}

/// The stroke width of an edge moving `bytes` per step, `max` the largest edge's bytes: 1
/// without communication, 2 to 9 by the share of the largest (square root, so that small
/// transfers stay visible).
pub fn stroke_width(bytes: f64, max: f64) -> usize {
    if bytes <= 0.0 || max <= 0.0 {
        return 1;
    }
    2 + (7.0 * (bytes / max).clamp(0.0, 1.0).sqrt()).round() as usize
}

/// The SVG of the folded graph `f` of `s`, and its edges.
pub fn draw(s: &StepGraph, f: &Folded) -> Result<(String, Vec<BoxEdge>)> {
    let edges = box_edges(s, f);
    if f.shown.is_empty() {
        return Ok((
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"0\" height=\"0\"></svg>".into(),
            edges,
        ));
    }
    let mut vg = VisualGraph::new(Orientation::TopToBottom);
    let mut handles = Vec::with_capacity(f.shown.len());
    for b in 0..f.shown.len() {
        let split = match &f.shown[b] {
            Shown::Op(k) => s.ops[*k].split,
            Shown::Folded(fold) => fold.split,
        };
        let folded = matches!(f.shown[b], Shown::Folded(_));
        let shape = ShapeKind::new_box(&box_label(s, f, b));
        let look = StyleAttr::new(
            Color::fast(if folded { "#333333" } else { "#555555" }),
            if folded { 3 } else { 1 },
            Color::from_name(split.colour()),
            if folded { 0 } else { 6 },
            FONT,
        );
        let size = get_shape_size(Orientation::TopToBottom, &shape, FONT, false);
        let props = format!(
            "class=\"box {}{}\" data-box=\"{b}\"",
            split.class(),
            if folded { " folded" } else { "" }
        );
        let e = Element::create_with_properties(shape, look, Orientation::TopToBottom, size, props);
        handles.push(vg.add_node(e));
    }
    let max = edges.iter().map(|e| e.bytes(s)).fold(0.0, f64::max);
    for (k, e) in edges.iter().enumerate() {
        let bytes = e.bytes(s);
        let comm = !e.comms.is_empty();
        let look = StyleAttr::new(
            Color::fast(if comm { "#c0392b" } else { "#8c8c8c" }),
            stroke_width(bytes, max),
            None,
            0,
            10,
        );
        let props = format!(
            "class=\"edge{}\" data-edge=\"{k}\"",
            if comm { " comm" } else { "" }
        );
        let label = if comm { e.label(s) } else { String::new() };
        let arrow = Arrow::with_properties(
            LineEndKind::None,
            LineEndKind::Arrow,
            LineStyleKind::Normal,
            &label,
            &look,
            props,
            &None,
            &None,
        );
        vg.add_edge(arrow, handles[e.from], handles[e.to]);
    }
    let mut svg = SVGWriter::new();
    // layout-rs asserts its own invariants; a failure there is reported, not a crash.
    let laid = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        vg.do_it(false, false, false, &mut svg);
        svg.finalize()
    }));
    let Ok(text) = laid else {
        bail!(
            "layout-rs could not lay out the graph of {} boxes and {} edges",
            f.shown.len(),
            edges.len()
        );
    };
    // Inline in HTML: no XML declaration; the page's CSS sets the fonts; arrow heads keep
    // their size on wide edges.
    let text = match text.find("<svg") {
        Some(at) => text[at..].to_string(),
        None => text,
    }
    .replace("<marker ", "<marker markerUnits=\"userSpaceOnUse\" ");
    Ok((text.replacen("<svg ", "<svg id=\"graph\" ", 1), edges))
}
