//! Plain-text tables for a terminal: columns as wide as their content, shrunk (widest first)
//! until the table fits the width, cells too long for their column wrapped onto more lines
//! at spaces. No colour, no box drawing: readable in a log or a CI transcript.

/// A table: a header row and rows of cells.
#[derive(Clone, Debug, Default)]
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
}

/// Two spaces between columns.
const GAP: usize = 2;
/// No column is shrunk below this.
const MIN_COLUMN: usize = 8;

impl Table {
    /// A table with these column headers.
    pub fn new<S: Into<String>>(headers: impl IntoIterator<Item = S>) -> Self {
        Self {
            headers: headers.into_iter().map(Into::into).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (missing cells are empty, extra cells are dropped).
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) {
        let mut cells: Vec<String> = cells.into_iter().map(Into::into).collect();
        cells.resize(self.headers.len(), String::new());
        self.rows.push(cells);
    }

    /// Whether the table has no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as text at most `width` columns wide (when every column can shrink to
    /// fit), each line ending in a newline.
    pub fn render(&self, width: usize) -> String {
        let n = self.headers.len();
        if n == 0 {
            return String::new();
        }
        let mut widths: Vec<usize> = (0..n)
            .map(|i| {
                std::iter::once(&self.headers[i])
                    .chain(self.rows.iter().map(|r| &r[i]))
                    .map(|c| c.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let total = |w: &[usize]| w.iter().sum::<usize>() + GAP * (n - 1);
        while total(&widths) > width {
            let (i, widest) = widths
                .iter()
                .copied()
                .enumerate()
                .max_by_key(|(_, w)| *w)
                .unwrap_or((0, 0));
            if widest <= MIN_COLUMN {
                break;
            }
            widths[i] -= 1;
        }
        let mut out = String::new();
        for row in std::iter::once(&self.headers).chain(&self.rows) {
            let wrapped: Vec<Vec<String>> = row
                .iter()
                .zip(&widths)
                .map(|(cell, w)| wrap(cell, *w))
                .collect();
            let lines = wrapped.iter().map(Vec::len).max().unwrap_or(1);
            for line in 0..lines {
                let mut text = String::new();
                for (i, cell) in wrapped.iter().enumerate() {
                    let part = cell.get(line).map_or("", String::as_str);
                    text.push_str(part);
                    if i + 1 < n {
                        let pad = widths[i] - part.chars().count() + GAP;
                        text.extend(std::iter::repeat_n(' ', pad));
                    }
                }
                out.push_str(text.trim_end());
                out.push('\n');
            }
        }
        out
    }
}

/// `text` as a list item (`- ` then indented lines) at most `width` wide.
pub(crate) fn bullet(text: &str, width: usize) -> String {
    let mut out = String::new();
    for (i, line) in wrap(text, width.saturating_sub(2)).into_iter().enumerate() {
        out.push_str(if i == 0 { "- " } else { "  " });
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// `text` in lines of at most `width` characters, broken at spaces where possible.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        let mut word = word.to_owned();
        loop {
            let used = line.chars().count();
            let len = word.chars().count();
            let sep = usize::from(used > 0);
            if used + sep + len <= width {
                if sep == 1 {
                    line.push(' ');
                }
                line.push_str(&word);
                break;
            }
            if used > 0 {
                lines.push(std::mem::take(&mut line));
                continue;
            }
            // A word longer than the column: cut it.
            let head: String = word.chars().take(width).collect();
            word = word.chars().skip(width).collect();
            lines.push(head);
            if word.is_empty() {
                break;
            }
        }
    }
    if !line.is_empty() || lines.is_empty() {
        lines.push(line);
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_and_fit() {
        let mut t = Table::new(["CLUSTER", "READY", "MESSAGE"]);
        t.row(["east", "True", "exported"]);
        t.row(["west", "False", "the Service loyalty/accrual does not exist in west; create it or delete the ServiceExport"]);
        let text = t.render(60);
        for line in text.lines() {
            assert!(line.chars().count() <= 60, "{line:?} is too wide:\n{text}");
        }
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "CLUSTER  READY  MESSAGE");
        assert_eq!(lines[1], "east     True   exported");
        assert!(
            lines[2].starts_with("west     False  the Service"),
            "{text}"
        );
        // The long message goes on below, in its column.
        assert!(lines[3].starts_with("                "), "{text}");
        assert!(text.contains("ServiceExport"), "nothing is lost:\n{text}");
    }

    #[test]
    fn a_word_longer_than_its_column_is_cut_not_lost() {
        assert_eq!(wrap("abcdefghij", 4), vec!["abcd", "efgh", "ij"]);
        assert_eq!(wrap("", 4), vec![""]);
        assert_eq!(wrap("a bb ccc", 4), vec!["a bb", "ccc"]);
    }
}
