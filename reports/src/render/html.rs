//! Self-contained HTML layout of report sections: inline CSS and inline SVG only.

use super::svg::escape;
use super::{sections, Report, Section, Table};

const STYLE: &str = "body{font-family:sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}\
table{border-collapse:collapse;margin:0.8em 0}th,td{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}\
th{background:#f2f2f2}figure{margin:1em 0}svg{max-width:100%;height:auto;border:1px solid #eee}";

/// The HTML text of `report`.
pub fn render_html(report: &Report) -> String {
    html(&report.title, &sections(report))
}

pub(super) fn html(title: &str, sections: &[Section]) -> String {
    let title = escape(title);
    let mut out = format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{title}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{title}</h1>\n"
    );
    for section in sections {
        out.push_str(&format!(
            "<section>\n<h2>{}</h2>\n",
            escape(&section.heading)
        ));
        for paragraph in &section.paragraphs {
            out.push_str(&format!("<p>{}</p>\n", escape(paragraph)));
        }
        for table in &section.tables {
            out.push_str(&table_html(table));
        }
        for plot in &section.plots {
            out.push_str(&format!(
                "<figure id=\"{}\">{}</figure>\n",
                escape(&plot.name),
                plot.svg
            ));
        }
        out.push_str("</section>\n");
    }
    out.push_str("</body>\n</html>\n");
    out
}

fn table_html(table: &Table) -> String {
    let mut out = String::from("<table>\n<tr>");
    for h in &table.header {
        out.push_str(&format!("<th>{}</th>", escape(h)));
    }
    out.push_str("</tr>\n");
    for row in &table.rows {
        out.push_str("<tr>");
        for c in row {
            out.push_str(&format!("<td>{}</td>", escape(c)));
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table>\n");
    out
}
