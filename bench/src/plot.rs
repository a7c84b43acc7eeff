//! `--plot out.svg`: a benchmark's rows/s per epoch, one line per scenario
//! (or cluster size), with the ceiling it is measured against drawn as a
//! dashed line, as an SVG file (plotters' SVG backend: no font files, no
//! system libraries).

use crate::cluster::{ClusterReport, NodesScenario};
use crate::local::Scenario;
use anyhow::{Result, anyhow};
use plotters::prelude::*;

/// One line of the chart: (epoch, rows/s) points.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Its name in the legend.
    pub name: String,
    /// Epoch and rows per second.
    pub points: Vec<(u64, f64)>,
}

/// 1234567 as "1.23 M".
fn rate(v: f64) -> String {
    match v.abs() {
        v if v >= 1e6 => format!("{:.2} M", v / 1e6),
        v if v >= 1e3 => format!("{:.0} k", v / 1e3),
        _ => format!("{v:.0}"),
    }
}

/// The chart as SVG text: `series` against epochs, `ceiling` (name, rows/s)
/// dashed across.
pub fn epochs_svg(title: &str, y_label: &str, series: &[Series], ceiling: Option<(&str, f64)>) -> Result<String> {
    let points = series.iter().flat_map(|s| s.points.iter());
    let max_epoch = points.clone().map(|p| p.0).max().unwrap_or(0).max(1);
    let values = || points.clone().map(|p| p.1).chain(ceiling.map(|c| c.1)).filter(|v| *v > 0.0);
    // A cold epoch and a warm one differ 10-100x: a log scale shows both.
    let top = values().fold(1.0f64, f64::max) * 1.6;
    let bottom = values().fold(f64::INFINITY, f64::min).min(top / 10.0).max(1e-3) / 1.6;
    let err = |e: &dyn std::fmt::Display| anyhow!("drawing the chart: {e}");
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (960, 560)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(18)
            .x_label_area_size(44)
            .y_label_area_size(90)
            .build_cartesian_2d(-0.25f64..max_epoch as f64 + 0.25, (bottom..top).log_scale())
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("epoch")
            .y_desc(format!("{y_label} (log scale)"))
            .x_labels(max_epoch as usize + 1)
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| rate(*y))
            .draw()
            .map_err(|e| err(&e))?;
        for (i, s) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let pts: Vec<(f64, f64)> = s.points.iter().map(|&(e, r)| (e as f64, r)).collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(s.name.clone())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 5, color.filled()))).map_err(|e| err(&e))?;
        }
        if let Some((name, v)) = ceiling {
            let line = vec![(-0.25, v), (max_epoch as f64 + 0.25, v)];
            chart
                .draw_series(DashedLineSeries::new(line, 10, 6, BLACK.stroke_width(2)))
                .map_err(|e| err(&e))?
                .label(format!("{name}: {}", rate(v)))
                .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLACK.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}

/// `bench local`'s chart: each scenario's epochs, the `copy` scenario
/// (batches assembled in advance, only copied: the machine's ceiling)
/// dashed.
pub fn local_svg(scenarios: &[Scenario]) -> Result<String> {
    let series: Vec<Series> = scenarios
        .iter()
        .filter(|s| s.scenario != "copy")
        .map(|s| Series {
            name: s.scenario.clone(),
            points: s.epochs.iter().filter(|e| e.secs > 0.0).map(|e| (e.epoch, e.rows as f64 / e.secs)).collect(),
        })
        .collect();
    let ceiling = scenarios.iter().find(|s| s.scenario == "copy").map(|s| ("ceiling (copy)", s.rows_per_s));
    epochs_svg("granary bench local: rows/s per epoch", "rows/s", &series, ceiling)
}

/// `bench cluster`'s chart: rows/s per rank in each epoch for each cluster
/// size, one node serving as many ranks dashed (`rows` in the dataset).
pub fn cluster_svg(report: &ClusterReport, rows: u64) -> Result<String> {
    let (series, ceiling) = cluster_series(&report.nodes, rows);
    epochs_svg(
        "granary bench cluster: rows/s per rank per epoch",
        "rows/s per rank",
        &series,
        ceiling.as_ref().map(|(n, v)| (n.as_str(), *v)),
    )
}

/// The lines and the dashed ceiling of [`cluster_svg`].
fn cluster_series(nodes: &[NodesScenario], rows: u64) -> (Vec<Series>, Option<(String, f64)>) {
    let per_rank = |ranks: u32, secs: f64| rows as f64 / f64::from(ranks.max(1)) / secs;
    let series: Vec<Series> = nodes
        .iter()
        .filter(|n| n.scenario == "nodes")
        .map(|n| Series {
            name: format!("{} node{}, {} ranks", n.nodes, if n.nodes == 1 { "" } else { "s" }, n.ranks),
            points: (0u64..)
                .zip(&n.epoch_secs)
                .filter(|&(_, &s)| s > 0.0)
                .map(|(e, &s)| (e, per_rank(n.ranks, s)))
                .collect(),
        })
        .collect();
    let ceiling = nodes
        .iter()
        .find(|n| n.scenario != "nodes")
        .map(|n| (format!("one node serving {} ranks, warm", n.ranks), n.warm_rows_per_s_per_rank));
    (series, ceiling)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local::EpochMeasure;

    fn scenario(name: &str, rates: &[f64]) -> Scenario {
        let epochs: Vec<EpochMeasure> = rates
            .iter()
            .enumerate()
            .map(|(i, r)| EpochMeasure { epoch: i as u64, rows: 1_000_000, bytes: 0, secs: 1e6 / r, digest: 0 })
            .collect();
        Scenario { scenario: name.into(), rows_per_s: rates[rates.len() - 1], gb_per_s: 0.0, epochs }
    }

    #[test]
    fn the_local_chart_has_a_line_per_scenario_and_the_ceiling_dashed() -> Result<()> {
        let svg = local_svg(&[
            scenario("copy", &[4.0e6, 4.1e6]),
            scenario("cold", &[2.6e5]),
            scenario("warm", &[3.4e6, 3.5e6]),
        ])?;
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
        for text in ["granary bench local", "epoch", "rows/s", "cold", "warm", "ceiling (copy): 4.10 M"] {
            assert!(svg.contains(text), "{text} missing");
        }
        // The copy scenario is the ceiling, not a line of its own; the
        // ceiling is dashed.
        assert!(!svg.contains(">copy<"));
        assert!(
            svg.contains("stroke-dasharray") || svg.matches("<polyline").count() + svg.matches("<line").count() > 4
        );
        Ok(())
    }

    fn nodes(scenario: &'static str, nodes: u32, ranks: u32, epoch_secs: Vec<f64>) -> NodesScenario {
        NodesScenario {
            scenario,
            nodes,
            ranks,
            epoch_secs,
            cold_vs_bound: 1.0,
            cpu_cold: None,
            cpu_warm: None,
            warm_rows_per_s_per_rank: 500_000.0,
            remote_read_ratio: 1.0,
            peer_bytes: 0,
            last_epoch_local_hit_share: 1.0,
            counters: Default::default(),
        }
    }

    #[test]
    fn the_cluster_chart_has_a_line_per_cluster_size_and_one_node_dashed() -> Result<()> {
        let runs = [
            nodes("nodes", 1, 2, vec![2.0, 0.5, 0.4]),
            nodes("nodes", 3, 6, vec![1.0, 0.2, 0.2]),
            nodes("single_node_same_world", 1, 6, vec![3.0, 0.2, 0.2]),
        ];
        let (series, ceiling) = cluster_series(&runs, 1_200_000);
        assert_eq!(series.len(), 2, "one line per cluster size; the single node is the ceiling");
        assert_eq!(series[1].name, "3 nodes, 6 ranks");
        // 1.2 M rows over 6 ranks in 0.2 s: a million rows/s per rank.
        assert_eq!(series[1].points, vec![(0, 200_000.0), (1, 1_000_000.0), (2, 1_000_000.0)]);
        assert_eq!(ceiling, Some(("one node serving 6 ranks, warm".to_string(), 500_000.0)));
        let svg = epochs_svg("t", "rows/s per rank", &series, ceiling.as_ref().map(|(n, v)| (n.as_str(), *v)))?;
        assert!(svg.contains("3 nodes, 6 ranks") && svg.contains("one node serving 6 ranks, warm: 500 k"));
        Ok(())
    }

    #[test]
    fn rates_read_as_people_write_them() {
        assert_eq!(rate(3_477_637.0), "3.48 M");
        assert_eq!(rate(262_918.0), "263 k");
        assert_eq!(rate(12.0), "12");
    }
}
