//! Compressed response bodies (`Content-Encoding: gzip` or `deflate`), inflated as they pass
//! so their usage can be read. Only what is read is decompressed: the response itself is
//! never changed. One [`Inflater`] per stream holds miniz_oxide's streaming state (its 32 KiB
//! window and tables, [`INFLATER_BYTES`] in all) and stops past a bound of bytes in and out,
//! so a decompression bomb costs at most what a plain body at the read bound costs.

use miniz_oxide::inflate::stream::{inflate, InflateState};
use miniz_oxide::{DataFormat, MZError, MZFlush, MZStatus};

/// The most an [`Inflater`] holds: itself and miniz_oxide's state (the 32 KiB window, the
/// Huffman tables). Measured by the unit tests.
pub const INFLATER_BYTES: usize = 44 << 10;

/// Decompressed bytes handed on per step: a stack buffer, so nothing else is allocated.
const STEP: usize = 2048;

/// A response's `Content-Encoding`, as far as the usage reader is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// No header, or `identity`: the body is read as it is.
    Identity,
    /// `gzip` (or its old name `x-gzip`), RFC 1952.
    Gzip,
    /// `deflate`: zlib-wrapped (RFC 1950) as the standard says, or raw deflate (RFC 1951) as
    /// some servers send it; told apart by the first two bytes.
    Deflate,
    /// Anything else (`br`, `zstd`, several codings stacked): not read, the estimate stands.
    Unsupported,
}

/// The encoding of a `Content-Encoding` value (None: no header). Codings are compared
/// case-insensitively; `identity` entries in a list are skipped; more than one other coding
/// is [`Encoding::Unsupported`].
pub fn encoding(value: Option<&[u8]>) -> Encoding {
    let Some(value) = value else {
        return Encoding::Identity;
    };
    let mut found = Encoding::Identity;
    for coding in value.split(|&b| b == b',').map(<[u8]>::trim_ascii) {
        let this = if coding.is_empty() || coding.eq_ignore_ascii_case(b"identity") {
            continue;
        } else if coding.eq_ignore_ascii_case(b"gzip") || coding.eq_ignore_ascii_case(b"x-gzip") {
            Encoding::Gzip
        } else if coding.eq_ignore_ascii_case(b"deflate") {
            Encoding::Deflate
        } else {
            return Encoding::Unsupported;
        };
        if found != Encoding::Identity {
            return Encoding::Unsupported;
        }
        found = this;
    }
    found
}

/// Why a compressed body could not be read. [`InflateError::name`] is the label in logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InflateError {
    /// A `Content-Encoding` other than gzip, deflate or identity.
    Unsupported,
    /// Not a valid gzip, zlib or deflate stream, or a checksum that does not match.
    Corrupt,
    /// More compressed or decompressed bytes than the bound.
    TooLarge,
}

impl InflateError {
    pub fn name(self) -> &'static str {
        match self {
            InflateError::Unsupported => "unsupported_encoding",
            InflateError::Corrupt => "corrupt_encoding",
            InflateError::TooLarge => "inflated_too_large",
        }
    }
}

/// Where in the compressed stream the next byte belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// `deflate`: the first byte, then the second, decide zlib or raw.
    Sniff(Option<u8>),
    /// gzip's fixed header: bytes seen, and its flags once read.
    GzipFixed(u8, u8),
    GzipExtraLen(u8, u16, u8),
    GzipExtra(u16, u8),
    GzipName(u8),
    GzipComment(u8),
    GzipHeaderCrc(u8),
    /// Deflate data (inside gzip: its CRC and size follow).
    Data,
    GzipTrailer(u8),
    /// The stream ended; gzip may start another member (RFC 1952), deflate ignores the rest.
    End,
}

const FHCRC: u8 = 2;
const FEXTRA: u8 = 4;
const FNAME: u8 = 8;
const FCOMMENT: u8 = 16;

/// Inflates one response body, handing the decompressed bytes to a sink as they come.
pub struct Inflater {
    gzip: bool,
    stage: Stage,
    state: Box<InflateState>,
    /// gzip: the CRC-32 and size (mod 2^32) of the member's data so far, and its trailer.
    crc: u32,
    size: u32,
    trailer: [u8; 8],
    bytes_in: u64,
    bytes_out: u64,
    bound: u64,
    failed: Option<InflateError>,
}

impl std::fmt::Debug for Inflater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inflater")
            .field("gzip", &self.gzip)
            .field("stage", &self.stage)
            .field("bytes_in", &self.bytes_in)
            .field("bytes_out", &self.bytes_out)
            .field("failed", &self.failed)
            .finish()
    }
}

impl Inflater {
    /// An inflater for gzip or deflate (None for the other encodings). Past `bound` bytes in
    /// or out it stops: [`InflateError::TooLarge`].
    pub fn new(encoding: Encoding, bound: u64) -> Option<Self> {
        let (gzip, stage) = match encoding {
            Encoding::Gzip => (true, Stage::GzipFixed(0, 0)),
            Encoding::Deflate => (false, Stage::Sniff(None)),
            Encoding::Identity | Encoding::Unsupported => return None,
        };
        Some(Inflater {
            gzip,
            stage,
            state: InflateState::new_boxed(DataFormat::Raw),
            crc: 0,
            size: 0,
            trailer: [0; 8],
            bytes_in: 0,
            bytes_out: 0,
            bound,
            failed: None,
        })
    }

    /// A chunk of the compressed body: what it decompresses to goes to `sink`. Never fails;
    /// once it failed ([`Self::failed`]), chunks are ignored.
    pub fn feed(&mut self, chunk: &[u8], sink: &mut dyn FnMut(&[u8])) {
        if self.failed.is_some() {
            return;
        }
        self.bytes_in = self.bytes_in.saturating_add(chunk.len() as u64);
        if self.bytes_in > self.bound {
            self.failed = Some(InflateError::TooLarge);
            return;
        }
        if let Err(why) = self.step(chunk, sink) {
            self.failed = Some(why);
        }
    }

    /// Why the body cannot be read, if it cannot.
    pub fn failed(&self) -> Option<InflateError> {
        self.failed
    }

    /// Whether the compressed data ended whole (its checksum, if any, verified); false while
    /// it could still go on (a body cut inside it).
    pub fn ended(&self) -> bool {
        self.stage == Stage::End
    }

    /// What this inflater holds: itself and the boxed state. Constant while reading.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>() + std::mem::size_of::<InflateState>()
    }

    fn step(&mut self, mut input: &[u8], sink: &mut dyn FnMut(&[u8])) -> Result<(), InflateError> {
        while let Some((&byte, rest)) = input.split_first() {
            self.stage = match self.stage {
                Stage::Data => {
                    input = self.data(input, sink)?;
                    continue;
                }
                Stage::End if !self.gzip => return Ok(()),
                Stage::End => {
                    // Another member: a fresh stream.
                    self.state.reset(DataFormat::Raw);
                    self.crc = 0;
                    self.size = 0;
                    Stage::GzipFixed(0, 0)
                }
                Stage::Sniff(None) => {
                    input = rest;
                    Stage::Sniff(Some(byte))
                }
                Stage::Sniff(Some(first)) => {
                    let zlib = first & 0x0f == 8
                        && first >> 4 <= 7
                        && (u16::from(first) << 8 | u16::from(byte)) % 31 == 0;
                    let format = if zlib {
                        DataFormat::Zlib
                    } else {
                        DataFormat::Raw
                    };
                    self.state.reset(format);
                    self.stage = Stage::Data;
                    // The first byte was held back to sniff: inflate it now, then the rest.
                    let held = [first];
                    if !self.data(&held, sink)?.is_empty() {
                        return Err(InflateError::Corrupt);
                    }
                    continue;
                }
                Stage::GzipFixed(seen, flags) => {
                    input = rest;
                    let flags = match seen {
                        0 if byte != 0x1f => return Err(InflateError::Corrupt),
                        1 if byte != 0x8b => return Err(InflateError::Corrupt),
                        2 if byte != 8 => return Err(InflateError::Corrupt),
                        3 if byte & 0xe0 != 0 => return Err(InflateError::Corrupt),
                        3 => byte,
                        _ => flags,
                    };
                    if seen < 9 {
                        Stage::GzipFixed(seen + 1, flags)
                    } else {
                        self.after_fixed(flags)
                    }
                }
                Stage::GzipExtraLen(seen, len, flags) => {
                    input = rest;
                    let len = len | u16::from(byte) << (8 * seen);
                    match (seen, len) {
                        (0, _) => Stage::GzipExtraLen(1, len, flags),
                        (_, 0) => self.after_extra(flags),
                        _ => Stage::GzipExtra(len, flags),
                    }
                }
                Stage::GzipExtra(left, flags) => {
                    // Skip the extra field's bytes in bulk.
                    let skip = input.len().min(usize::from(left));
                    input = input.get(skip..).unwrap_or_default();
                    match left - skip as u16 {
                        0 => self.after_extra(flags),
                        left => Stage::GzipExtra(left, flags),
                    }
                }
                Stage::GzipName(flags) => {
                    input = rest;
                    if byte == 0 {
                        self.after_name(flags)
                    } else {
                        Stage::GzipName(flags)
                    }
                }
                Stage::GzipComment(flags) => {
                    input = rest;
                    if byte == 0 {
                        self.after_comment(flags)
                    } else {
                        Stage::GzipComment(flags)
                    }
                }
                Stage::GzipHeaderCrc(seen) => {
                    // The header's own CRC is not checked: the data's CRC is.
                    input = rest;
                    if seen == 0 {
                        Stage::GzipHeaderCrc(1)
                    } else {
                        Stage::Data
                    }
                }
                Stage::GzipTrailer(seen) => {
                    input = rest;
                    if let Some(entry) = self.trailer.get_mut(usize::from(seen)) {
                        *entry = byte;
                    }
                    if seen < 7 {
                        Stage::GzipTrailer(seen + 1)
                    } else {
                        let [c0, c1, c2, c3, s0, s1, s2, s3] = self.trailer;
                        let crc = u32::from_le_bytes([c0, c1, c2, c3]);
                        let size = u32::from_le_bytes([s0, s1, s2, s3]);
                        if crc != self.crc || size != self.size {
                            return Err(InflateError::Corrupt);
                        }
                        Stage::End
                    }
                }
            };
        }
        Ok(())
    }

    fn after_fixed(&self, flags: u8) -> Stage {
        if flags & FEXTRA != 0 {
            Stage::GzipExtraLen(0, 0, flags)
        } else {
            self.after_extra(flags)
        }
    }

    fn after_extra(&self, flags: u8) -> Stage {
        if flags & FNAME != 0 {
            Stage::GzipName(flags)
        } else {
            self.after_name(flags)
        }
    }

    fn after_name(&self, flags: u8) -> Stage {
        if flags & FCOMMENT != 0 {
            Stage::GzipComment(flags)
        } else {
            self.after_comment(flags)
        }
    }

    fn after_comment(&self, flags: u8) -> Stage {
        if flags & FHCRC != 0 {
            Stage::GzipHeaderCrc(0)
        } else {
            Stage::Data
        }
    }

    /// Inflates from `input` until it is used up or the deflate data ends; returns what is
    /// left of `input` (the stage is then the trailer or the end).
    fn data<'a>(
        &mut self,
        mut input: &'a [u8],
        sink: &mut dyn FnMut(&[u8]),
    ) -> Result<&'a [u8], InflateError> {
        let mut out = [0u8; STEP];
        loop {
            let result = inflate(&mut self.state, input, &mut out, MZFlush::None);
            input = input.get(result.bytes_consumed..).unwrap_or_default();
            let written = out.get(..result.bytes_written).unwrap_or_default();
            self.bytes_out = self.bytes_out.saturating_add(written.len() as u64);
            if self.bytes_out > self.bound {
                return Err(InflateError::TooLarge);
            }
            if self.gzip {
                self.crc = crc32(self.crc, written);
                self.size = self.size.wrapping_add(written.len() as u32);
            }
            if !written.is_empty() {
                sink(written);
            }
            match result.status {
                Ok(MZStatus::StreamEnd) => {
                    self.stage = if self.gzip {
                        Stage::GzipTrailer(0)
                    } else {
                        Stage::End
                    };
                    return Ok(input);
                }
                // More output may be waiting in the window while the buffer was full.
                Ok(_) if result.bytes_written == STEP => {}
                Ok(_)
                    if !input.is_empty() && (result.bytes_consumed > 0 || !written.is_empty()) => {}
                // Everything given was taken: the next chunk goes on.
                Ok(_) | Err(MZError::Buf) if input.is_empty() => return Ok(input),
                Ok(_) | Err(_) => return Err(InflateError::Corrupt),
            }
        }
    }
}

/// CRC-32 (IEEE, reflected, as gzip uses), a byte at a time over a table built at compile time.
fn crc32(crc: u32, bytes: &[u8]) -> u32 {
    let mut c = !crc;
    for &b in bytes {
        let i = usize::from((c as u8) ^ b);
        c = CRC_TABLE.get(i).copied().unwrap_or_default() ^ (c >> 8);
    }
    !c
}

const CRC_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut n = 0;
    while n < 256 {
        let mut c = n as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                0xedb8_8320 ^ (c >> 1)
            } else {
                c >> 1
            };
            k += 1;
        }
        table[n] = c;
        n += 1;
    }
    table
};

#[cfg(test)]
#[path = "inflate_tests.rs"]
mod tests;
