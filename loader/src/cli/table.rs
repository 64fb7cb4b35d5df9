//! Aligned columns for human output; every cell printable
//! ([`printable::line`]).

use std::io::{self, Write};

use policy::printable;

/// Rows of cells printed with every column padded to its widest cell.
#[derive(Debug, Default)]
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with a header row.
    pub fn with_header(header: &[&str]) -> Self {
        Self { rows: vec![header.iter().map(|h| (*h).to_owned()).collect()] }
    }

    /// Appends a row; a cell's control characters are escaped (one line
    /// each, line breaks as `\n`).
    pub fn push(&mut self, row: Vec<String>) {
        let row = row
            .into_iter()
            .map(|cell| match printable::line(&cell) {
                std::borrow::Cow::Borrowed(_) => cell,
                std::borrow::Cow::Owned(escaped) => escaped,
            })
            .collect();
        self.rows.push(row);
    }

    /// Writes the table; columns are separated by two spaces and the last
    /// column is not padded.
    ///
    /// # Errors
    ///
    /// I/O errors of `out`.
    pub fn write(&self, out: &mut dyn Write) -> io::Result<()> {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|r| r.get(c))
                    .map(|s| s.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for row in &self.rows {
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate() {
                if c + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    let pad = widths[c].saturating_sub(cell.chars().count());
                    line.push_str(cell);
                    line.extend(std::iter::repeat_n(' ', pad + 2));
                }
            }
            writeln!(out, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_aligned() {
        let mut t = Table::with_header(&["NAME", "CLASS", "ENTRY"]);
        t.push(vec!["a".into(), "dangerous".into(), "/x".into()]);
        t.push(vec!["long_name".into(), "safe".into(), "/y/z".into()]);
        let mut out = Vec::new();
        t.write(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "NAME       CLASS      ENTRY\n\
             a          dangerous  /x\n\
             long_name  safe       /y/z\n"
        );
    }

    #[test]
    fn cells_are_one_line_without_control_characters() {
        let mut t = Table::with_header(&["NAME", "DESCRIPTION"]);
        t.push(vec!["x".into(), "two\nlines \x1b[31mred\x1b[0m \u{9b}2J".into()]);
        let mut out = Vec::new();
        t.write(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "NAME  DESCRIPTION\n\
             x     two\\nlines \\x1b[31mred\\x1b[0m \\u{9b}2J\n"
        );
    }
}
