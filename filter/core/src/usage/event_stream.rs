//! `text/event-stream` per the WHATWG "event stream interpretation": lines end with `\n`,
//! `\r\n` or `\r`; a leading BOM is skipped; `:` starts a comment; `data` lines (one optional
//! space after the colon) are joined with `\n`; other fields are ignored; a blank line
//! dispatches the event. Each event's data goes straight into a JSON [`Scanner`] as it
//! arrives: no line or event is held.

use super::json::Doc;
use super::sum::{combine, BodyUsage, Docs, MAX_FIELDS};
use super::{Unreadable, UsageRead};

const BOM: &[u8] = b"\xef\xbb\xbf";
const DONE: &[u8] = b"[DONE]";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// Nothing of the line yet (a line break here is a blank line).
    Start,
    /// In the field name: how many bytes, and whether they spell `data` so far.
    Field {
        read: u8,
        data: bool,
    },
    /// Right after `data:`: one space is skipped.
    DataColon,
    /// In a field's value (a data line's goes to the scanner).
    Value {
        data: bool,
    },
    Comment,
}

#[derive(Debug)]
pub(crate) struct Events {
    line: Line,
    /// A `\r` ended the last line: a `\n` right after it belongs to it.
    after_cr: bool,
    /// Bytes of a leading BOM matched (3: done with the stream's start).
    bom: u8,
    /// The pending event has a data line.
    has_data: bool,
    /// The pending event's data so far spells the start of `[DONE]`.
    done_read: u8,
    done_possible: bool,
    doc: Docs,
    /// Per field, the verdict of the last dispatched event with something (not `null`) at
    /// one of its paths.
    last: [Option<UsageRead>; MAX_FIELDS],
}

impl Events {
    pub(crate) fn new(usage: &BodyUsage) -> Self {
        Events {
            line: Line::Start,
            after_cr: false,
            bom: 0,
            has_data: false,
            done_read: 0,
            done_possible: true,
            doc: Docs::new(usage),
            last: [None; MAX_FIELDS],
        }
    }

    pub(crate) fn feed(&mut self, chunk: &[u8]) {
        let mut i = 0;
        while let Some(&b) = chunk.get(i) {
            if usize::from(self.bom) < BOM.len() {
                if BOM.get(usize::from(self.bom)) == Some(&b) {
                    self.bom += 1;
                    i += 1;
                    continue;
                }
                if self.bom > 0 {
                    // A broken BOM: its bytes were a field name that is not `data`.
                    self.line = Line::Field {
                        read: self.bom,
                        data: false,
                    };
                }
                self.bom = BOM.len() as u8;
            }
            if self.after_cr {
                self.after_cr = false;
                if b == b'\n' {
                    i += 1;
                    continue;
                }
            }
            if let Line::Value { data: true } = self.line {
                // The rest of the line in one go.
                let rest = chunk.get(i..).unwrap_or_default();
                let len = rest
                    .iter()
                    .position(|&c| c == b'\n' || c == b'\r')
                    .unwrap_or(rest.len());
                let value = rest.get(..len).unwrap_or_default();
                self.data(value);
                i += len;
                if len > 0 {
                    continue;
                }
            }
            self.step(b);
            i += 1;
        }
    }

    fn step(&mut self, b: u8) {
        if b == b'\n' || b == b'\r' {
            self.after_cr = b == b'\r';
            return self.line_end();
        }
        match self.line {
            Line::Start if b == b':' => self.line = Line::Comment,
            Line::Start => {
                self.line = Line::Field {
                    read: 0,
                    data: true,
                };
                self.step(b);
            }
            Line::Field { read, data } => {
                if b == b':' {
                    let is_data = data && usize::from(read) == 4;
                    if is_data {
                        self.data_line();
                        self.line = Line::DataColon;
                    } else {
                        self.line = Line::Value { data: false };
                    }
                } else {
                    self.line = Line::Field {
                        read: read.saturating_add(1),
                        data: data && b"data".get(usize::from(read)) == Some(&b),
                    };
                }
            }
            Line::DataColon => {
                self.line = Line::Value { data: true };
                if b != b' ' {
                    self.data(&[b]);
                }
            }
            Line::Value { data } => {
                if data {
                    self.data(&[b]);
                }
            }
            Line::Comment => {}
        }
    }

    fn line_end(&mut self) {
        match self.line {
            Line::Start => self.dispatch(),
            // A field name alone is the field with an empty value.
            Line::Field {
                read: 4,
                data: true,
            } => self.data_line(),
            _ => {}
        }
        self.line = Line::Start;
    }

    /// A data line starts: lines after the first are joined with a line feed.
    fn data_line(&mut self) {
        if self.has_data {
            self.data(b"\n");
        }
        self.has_data = true;
    }

    fn data(&mut self, bytes: &[u8]) {
        if self.done_possible {
            let at = usize::from(self.done_read);
            let fits = DONE.get(at..).is_some_and(|rest| rest.starts_with(bytes));
            if fits {
                self.done_read += bytes.len() as u8;
            } else {
                self.done_possible = false;
            }
        }
        self.doc.feed(bytes);
    }

    fn dispatch(&mut self) {
        if !self.has_data {
            return;
        }
        let is_done = self.done_possible && usize::from(self.done_read) == DONE.len();
        if !is_done {
            for field in 0..usize::from(self.doc.fields) {
                let read = match self.doc.field(field) {
                    // Blank data (`data:` alone): nothing said.
                    Doc::Empty | Doc::Read(UsageRead::Missing) => continue,
                    // The event is whole: JSON that stops short in it is malformed.
                    Doc::Read(UsageRead::Invalid(Unreadable::Truncated)) => {
                        UsageRead::Invalid(Unreadable::NotJson)
                    }
                    Doc::Read(read) => read,
                };
                if let Some(last) = self.last.get_mut(field) {
                    *last = Some(read);
                }
            }
        }
        self.has_data = false;
        self.done_read = 0;
        self.done_possible = true;
        self.doc.reset();
    }

    /// Per field, the last dispatched event with a value at its paths gives the verdict; a
    /// partial event at the end is ignored. A required field in no event: `Missing` if the
    /// stream ended whole, else `Truncated`.
    pub(crate) fn finish(&mut self, complete: bool) -> UsageRead {
        let partial_bom = self.bom > 0 && usize::from(self.bom) < BOM.len();
        let cut_in_event = self.has_data || self.line != Line::Start || partial_bom;
        match combine(self.doc.required, &self.doc.weights, self.last.into_iter()) {
            UsageRead::Missing if !complete || cut_in_event => {
                UsageRead::Invalid(Unreadable::Truncated)
            }
            read => read,
        }
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.doc.heap_bytes()
    }
}
