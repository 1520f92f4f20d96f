//! Markdown layout of report sections; plots are linked as `plots/<name>.svg`.

use super::{sections, Report, Section, Table};

/// The Markdown text of `report` (plots linked, written by `write_report`).
pub fn render_markdown(report: &Report) -> String {
    markdown(&report.title, &sections(report))
}

pub(super) fn markdown(title: &str, sections: &[Section]) -> String {
    let mut out = format!("# {title}\n");
    for section in sections {
        out.push_str(&format!("\n## {}\n\n", section.heading));
        for paragraph in &section.paragraphs {
            out.push_str(&format!("{paragraph}\n\n"));
        }
        for table in &section.tables {
            out.push_str(&table_text(table));
            out.push('\n');
        }
        for plot in &section.plots {
            out.push_str(&format!("![{0}](plots/{0}.svg)\n\n", plot.name));
        }
    }
    out
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

fn table_text(table: &Table) -> String {
    let row = |cells: &[String]| {
        let cells: Vec<String> = cells.iter().map(|c| cell(c)).collect();
        format!("| {} |\n", cells.join(" | "))
    };
    let mut out = row(&table.header);
    out.push_str(&format!("|{}\n", "---|".repeat(table.header.len())));
    for r in &table.rows {
        out.push_str(&row(r));
    }
    out
}
