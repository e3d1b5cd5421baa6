//! The slurm.conf grammar, untyped: every logical line becomes an
//! [`Entry`] holding its `Key=Value` pairs and its file:line.
//!
//! What is understood (as Slurm's own `parse_config.c` does):
//! * `#` starts a comment anywhere on a line (quotes do not protect it);
//!   `\#` is a literal `#` and `\\` a literal backslash;
//! * a line ending in `\` continues on the next line (joined without
//!   adding a space, so `Nodes=a,\` + `b` reads `Nodes=a,b`);
//! * `Key=Value` pairs, several per line, separated by blanks; blanks
//!   are allowed around `=`; values are a run of non-blank characters or
//!   a double-quoted string (`Features="a b"`, quotes removed);
//! * keys keep their spelling; compare them with [`Entry::get`] (ASCII
//!   case-insensitive);
//! * `Include <path>` (any case; path may be quoted): relative paths are
//!   resolved against the including file's directory; includes nest up to
//!   [`MAX_INCLUDE_DEPTH`] and a cycle is reported, not followed;
//! * blank lines, trailing blanks, CRLF line ends, a UTF-8 BOM; bytes
//!   that are not UTF-8 are read lossily with a warning.
//!
//! Problems never abort the parse: they become [`Diagnostic`]s and the
//! rest of the file is still read.

use std::io;
use std::path::{Component, Path, PathBuf};

use nom::bytes::complete::{is_not, tag, take_while, take_while1};
use nom::character::complete::space0;
use nom::sequence::{delimited, preceded, tuple};
use nom::IResult;

use crate::diag::{Diagnostic, Error, Severity};

/// Deepest `Include` nesting followed (the top-level file is depth 0).
pub const MAX_INCLUDE_DEPTH: usize = 16;
/// Largest file a [`FsLoader`] reads.
pub const MAX_FILE_BYTES: u64 = 16 << 20;

/// One logical line: its pairs in order, where it starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub file: String,
    pub line: u32,
    /// `(key as written, value without quotes)`.
    pub pairs: Vec<(String, String)>,
}

impl Entry {
    /// The first pair's key and value (every entry has at least one pair).
    pub fn head(&self) -> (&str, &str) {
        self.pairs.first().map(|(k, v)| (k.as_str(), v.as_str())).unwrap_or(("", ""))
    }

    /// The value of the first pair whose key matches, ignoring ASCII case.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs.iter().find(|(k, _)| k.eq_ignore_ascii_case(key)).map(|(_, v)| v.as_str())
    }

    /// `file:line` of this entry.
    pub fn location(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }
}

/// Result of parsing: every entry, every diagnostic, in file order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    pub entries: Vec<Entry>,
    pub diagnostics: Vec<Diagnostic>,
}

impl Parsed {
    /// True when any diagnostic is an error.
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(|d| d.severity == Severity::Error)
    }

    /// `Err` with every error diagnostic if there is one.
    pub fn check(&self) -> Result<(), Error> {
        match Error::from_diagnostics(&self.diagnostics) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Where `Include`d (and top-level) files come from.
pub trait Loader {
    fn read(&mut self, path: &Path) -> io::Result<Vec<u8>>;
}

impl<F: FnMut(&Path) -> io::Result<Vec<u8>>> Loader for F {
    fn read(&mut self, path: &Path) -> io::Result<Vec<u8>> {
        self(path)
    }
}

/// Reads from the file system, refusing files over [`MAX_FILE_BYTES`].
#[derive(Clone, Copy, Debug, Default)]
pub struct FsLoader;

impl Loader for FsLoader {
    fn read(&mut self, path: &Path) -> io::Result<Vec<u8>> {
        use std::io::Read;
        let f = std::fs::File::open(path)?;
        let mut buf = Vec::new();
        f.take(MAX_FILE_BYTES + 1).read_to_end(&mut buf)?;
        if buf.len() as u64 > MAX_FILE_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("file is larger than {MAX_FILE_BYTES} bytes"),
            ));
        }
        Ok(buf)
    }
}

/// A loader that refuses everything: `Include` in text parsed by
/// [`parse_str`] gives an error diagnostic.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoLoader;

impl Loader for NoLoader {
    fn read(&mut self, _path: &Path) -> io::Result<Vec<u8>> {
        Err(io::Error::new(io::ErrorKind::Unsupported, "Include is not followed when parsing text"))
    }
}

/// Parses `text`, naming it `origin` in diagnostics. `Include` lines are
/// reported as errors (there is nothing to read them from); use
/// [`parse_str_with`] to follow them.
pub fn parse_str(text: &str, origin: &str) -> Parsed {
    parse_str_with(text, origin, &mut NoLoader)
}

/// Parses `text` named `origin` (a path: includes are relative to its
/// directory), reading `Include`d files through `loader`.
pub fn parse_str_with(text: &str, origin: &str, loader: &mut dyn Loader) -> Parsed {
    let mut out = Parsed::default();
    let mut stack = vec![normalize(Path::new(origin))];
    parse_into(text, origin, loader, &mut stack, &mut out);
    out
}

/// Reads and parses the file at `path` from the file system, following
/// `Include`. `Err` only when `path` itself cannot be read; problems
/// inside are diagnostics (see [`Parsed::check`]).
pub fn load_file(path: &Path) -> Result<Parsed, Error> {
    load_with(path, &mut FsLoader)
}

/// [`load_file`] through an injectable loader.
pub fn load_with(path: &Path, loader: &mut dyn Loader) -> Result<Parsed, Error> {
    let name = path.display().to_string();
    let bytes = loader.read(path).map_err(|source| Error::Io { path: name.clone(), source })?;
    let mut out = Parsed::default();
    let text = decode(&bytes, &name, 0, &mut out.diagnostics);
    let mut stack = vec![normalize(path)];
    parse_into(&text, &name, loader, &mut stack, &mut out);
    Ok(out)
}

fn decode(bytes: &[u8], file: &str, line: u32, diags: &mut Vec<Diagnostic>) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_string(),
        Err(e) => {
            diags.push(Diagnostic::warning(
                file,
                line,
                format!("file is not valid UTF-8 (first bad byte at offset {}); read lossily", e.valid_up_to()),
            ));
            String::from_utf8_lossy(bytes).into_owned()
        }
    }
}

/// Lexical normalisation (no file-system access): drops `.`, folds `..`.
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

fn parse_into(text: &str, file: &str, loader: &mut dyn Loader, stack: &mut Vec<PathBuf>, out: &mut Parsed) {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    for (line_no, logical) in logical_lines(text) {
        let trimmed = logical.trim();
        if trimmed.is_empty() {
            continue;
        }
        if let Some(target) = include_target(trimmed) {
            include(target, file, line_no, loader, stack, out);
            continue;
        }
        let (pairs, problems) = parse_pairs(trimmed);
        for p in problems {
            out.diagnostics.push(Diagnostic::error(file, line_no, p));
        }
        if !pairs.is_empty() {
            out.entries.push(Entry { file: file.to_string(), line: line_no, pairs });
        }
    }
}

fn include(target: &str, file: &str, line: u32, loader: &mut dyn Loader, stack: &mut Vec<PathBuf>, out: &mut Parsed) {
    let target = unquote(target);
    if target.is_empty() {
        out.diagnostics.push(Diagnostic::error(file, line, "Include without a file name"));
        return;
    }
    let mut path = PathBuf::from(target);
    if path.is_relative() {
        if let Some(dir) = Path::new(file).parent() {
            path = dir.join(path);
        }
    }
    let path = normalize(&path);
    let shown = path.display().to_string();
    if stack.contains(&path) {
        out.diagnostics.push(Diagnostic::error(file, line, format!("Include {shown}: include cycle, not followed")));
        return;
    }
    if stack.len() > MAX_INCLUDE_DEPTH {
        out.diagnostics.push(Diagnostic::error(
            file,
            line,
            format!("Include {shown}: includes nested deeper than {MAX_INCLUDE_DEPTH}, not followed"),
        ));
        return;
    }
    match loader.read(&path) {
        Ok(bytes) => {
            let text = decode(&bytes, &shown, 0, &mut out.diagnostics);
            stack.push(path);
            parse_into(&text, &shown, loader, stack, out);
            stack.pop();
        }
        Err(e) => out.diagnostics.push(Diagnostic::error(file, line, format!("Include {shown}: cannot read: {e}"))),
    }
}

fn unquote(s: &str) -> &str {
    let s = s.trim();
    if s.len() >= 2 && ((s.starts_with('"') && s.ends_with('"')) || (s.starts_with('\'') && s.ends_with('\''))) {
        &s[1..s.len() - 1]
    } else {
        s
    }
}

/// `Include path` → `Some("path")` (also `include` with no path → `Some("")`).
fn include_target(line: &str) -> Option<&str> {
    let head = line.get(..7)?;
    if !head.eq_ignore_ascii_case("include") {
        return None;
    }
    let rest = &line[7..];
    if rest.is_empty() {
        return Some("");
    }
    if rest.starts_with([' ', '\t']) {
        Some(rest.trim())
    } else {
        None
    }
}

/// Joins continuation lines, strips comments and resolves `\#`, `\\`.
/// Yields `(first physical line number, logical line)`.
fn logical_lines(text: &str) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    let mut pending: Option<(u32, String)> = None;
    for (i, phys) in text.split('\n').enumerate() {
        let line_no = u32::try_from(i + 1).unwrap_or(u32::MAX);
        let phys = phys.strip_suffix('\r').unwrap_or(phys);
        let (content, continues) = strip_line(phys);
        let (start, mut acc) = pending.take().unwrap_or((line_no, String::new()));
        acc.push_str(&content);
        if continues {
            pending = Some((start, acc));
        } else {
            out.push((start, acc));
        }
    }
    if let Some(p) = pending {
        out.push(p);
    }
    out
}

/// One physical line → (text without comment/escapes, ends with `\`).
fn strip_line(line: &str) -> (String, bool) {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '#' => break,
            '\\' => match chars.peek() {
                Some('#') => {
                    out.push('#');
                    chars.next();
                }
                Some('\\') => {
                    out.push('\\');
                    chars.next();
                }
                _ => {
                    // Only blanks (or a comment) after it: a continuation.
                    // Scans just the blank run, so the whole line stays linear.
                    let mut after = chars.clone().skip_while(|c| c.is_whitespace());
                    if matches!(after.next(), None | Some('#')) {
                        return (out, true);
                    }
                    out.push('\\');
                }
            },
            c => out.push(c),
        }
    }
    (out, false)
}

fn is_key_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn key(i: &str) -> IResult<&str, &str> {
    take_while1(is_key_char)(i)
}

fn quoted(i: &str) -> IResult<&str, &str> {
    delimited(tag("\""), take_while(|c| c != '"'), tag("\""))(i)
}

fn bare(i: &str) -> IResult<&str, &str> {
    is_not(" \t")(i)
}

fn pair(i: &str) -> IResult<&str, (&str, &str)> {
    let (i, (k, _, _, _)) = tuple((key, space0, tag("="), space0))(i)?;
    // An empty value (`Key=` at end of line or before a blank) is allowed.
    if i.is_empty() || i.starts_with([' ', '\t']) {
        return Ok((i, (k, "")));
    }
    // A value that opens a quote must close it.
    let (i, v) = if i.starts_with('"') { quoted(i)? } else { bare(i)? };
    Ok((i, (k, v)))
}

/// All `Key=Value` pairs of one logical line, plus one message per
/// piece that is not a pair (which is skipped).
fn parse_pairs(line: &str) -> (Vec<(String, String)>, Vec<String>) {
    let mut pairs = Vec::new();
    let mut problems = Vec::new();
    let mut rest = line;
    loop {
        rest = rest.trim_start_matches([' ', '\t']);
        if rest.is_empty() {
            break;
        }
        match preceded(space0, pair)(rest) {
            Ok((r, (k, v))) if r.is_empty() || r.starts_with([' ', '\t']) => {
                pairs.push((k.to_string(), v.to_string()));
                rest = r;
            }
            _ => {
                let bad_end = skip_bad(rest);
                let bad = &rest[..bad_end];
                problems.push(describe_bad(bad));
                rest = &rest[bad_end..];
            }
        }
    }
    (pairs, problems)
}

/// Length of the malformed piece at the start of `s`: through a quoted
/// string if one was opened, else to the next blank.
fn skip_bad(s: &str) -> usize {
    if let Some(q) = s.find('"') {
        let blank = s.find([' ', '\t']).unwrap_or(s.len());
        if q < blank {
            // Skip past the closing quote if any, else to the end.
            return match s[q + 1..].find('"') {
                Some(end) => {
                    let after = q + 1 + end + 1;
                    after + s[after..].find([' ', '\t']).unwrap_or(s.len() - after)
                }
                None => s.len(),
            };
        }
    }
    s.find([' ', '\t']).unwrap_or(s.len())
}

fn describe_bad(bad: &str) -> String {
    let shown: String = bad.chars().take(60).collect();
    let ellipsis = if bad.chars().count() > 60 { "…" } else { "" };
    if let Some(eq) = bad.find('=') {
        let (k, v) = (&bad[..eq], &bad[eq + 1..]);
        if k.is_empty() {
            return format!("missing key before '=' in \"{shown}{ellipsis}\"");
        }
        if !k.chars().all(is_key_char) {
            return format!("bad key \"{}\": keys are letters, digits and '_'", k.chars().take(60).collect::<String>());
        }
        if v.starts_with('"') && v[1..].find('"').is_none() {
            return format!("unterminated quote in value of {k}");
        }
        return format!("unexpected text after the value of {k}: \"{shown}{ellipsis}\"");
    }
    format!("expected Key=Value, found \"{shown}{ellipsis}\"")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// Renders entries as `line: k=v k=v` and diagnostics as their Display.
    fn render(p: &Parsed) -> Vec<String> {
        let mut out: Vec<String> = p
            .entries
            .iter()
            .map(|e| {
                let pairs: Vec<String> = e.pairs.iter().map(|(k, v)| format!("{k}=[{v}]")).collect();
                format!("{}:{} {}", e.file, e.line, pairs.join(" "))
            })
            .collect();
        out.extend(p.diagnostics.iter().map(|d| format!("{:?} {d}", d.severity)));
        out
    }

    fn check(input: &str, expected: &[&str]) {
        let got = render(&parse_str(input, "t.conf"));
        assert_eq!(got, expected, "input: {input:?}");
    }

    #[test]
    fn grammar_table() {
        check("", &[]);
        check("\n\n   \n", &[]);
        check("ClusterName=alpha", &["t.conf:1 ClusterName=[alpha]"]);
        check("clustername=alpha  \r\n", &["t.conf:1 clustername=[alpha]"]);
        check("# only a comment\nA=1 # trailing", &["t.conf:2 A=[1]"]);
        check("A=x\\#y", &["t.conf:1 A=[x#y]"]);
        check("A=x\\\\", &["t.conf:1 A=[x\\]"]);
        check("NodeName=x CPUs=4 Gres=gpu:h100:8", &["t.conf:1 NodeName=[x] CPUs=[4] Gres=[gpu:h100:8]"]);
        check("NodeName=a \\\n  CPUs=4\nB=2", &["t.conf:1 NodeName=[a] CPUs=[4]", "t.conf:3 B=[2]"]);
        check("Nodes=a,\\\nb", &["t.conf:1 Nodes=[a,b]"]);
        check("A=1 \\   \r\nB=2", &["t.conf:1 A=[1] B=[2]"]);
        check("A=1 \\", &["t.conf:1 A=[1]"]);
        check("Features=\"a b\" X=1", &["t.conf:1 Features=[a b] X=[1]"]);
        check("A = 1", &["t.conf:1 A=[1]"]);
        check("A=", &["t.conf:1 A=[]"]);
        // As in Slurm, blanks after `=` are skipped: the value is `B=2`.
        check("A= B=2", &["t.conf:1 A=[B=2]"]);
        check("\u{feff}A=1", &["t.conf:1 A=[1]"]);
        check("\tA=1\t", &["t.conf:1 A=[1]"]);
        check("K=a=b", &["t.conf:1 K=[a=b]"]);
        // Errors: the rest of the line is still read.
        check("garbage A=1", &["t.conf:1 A=[1]", "Error t.conf:1: expected Key=Value, found \"garbage\""]);
        check("A=\"open", &["Error t.conf:1: unterminated quote in value of A"]);
        check("=x B=1", &["t.conf:1 B=[1]", "Error t.conf:1: missing key before '=' in \"=x\""]);
        check("a.b=1", &["Error t.conf:1: bad key \"a.b\": keys are letters, digits and '_'"]);
        check("A=\"x\"y", &["Error t.conf:1: unexpected text after the value of A: \"A=\"x\"y\""]);
        check(
            "A=1\nInclude other.conf",
            &[
                "t.conf:1 A=[1]",
                "Error t.conf:2: Include other.conf: cannot read: Include is not followed when parsing text",
            ],
        );
        check("include", &["Error t.conf:1: Include without a file name"]);
        check("IncludeX=1", &["t.conf:1 IncludeX=[1]"]);
    }

    #[test]
    fn entry_get_is_case_insensitive() {
        let p = parse_str("NodeName=a cpus=4", "t");
        assert_eq!(p.entries[0].get("CPUs"), Some("4"));
        assert_eq!(p.entries[0].get("NODENAME"), Some("a"));
        assert_eq!(p.entries[0].get("x"), None);
        assert_eq!(p.entries[0].head(), ("NodeName", "a"));
    }

    fn map_loader(files: &[(&str, &str)]) -> impl FnMut(&Path) -> io::Result<Vec<u8>> {
        let m: HashMap<PathBuf, Vec<u8>> =
            files.iter().map(|(p, t)| (PathBuf::from(p), t.as_bytes().to_vec())).collect();
        move |p: &Path| m.get(p).cloned().ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "not found"))
    }

    fn check_files(files: &[(&str, &str)], expected: &[&str]) {
        let mut loader = map_loader(files);
        let got = match load_with(Path::new(files[0].0), &mut loader) {
            Ok(p) => render(&p),
            Err(e) => vec![format!("Err {e}")],
        };
        assert_eq!(got, expected);
    }

    #[test]
    fn include_table() {
        check_files(
            &[("/etc/slurm/slurm.conf", "A=1\nINCLUDE nodes.conf\nB=2"), ("/etc/slurm/nodes.conf", "NodeName=n1")],
            &[
                "/etc/slurm/slurm.conf:1 A=[1]",
                "/etc/slurm/nodes.conf:1 NodeName=[n1]",
                "/etc/slurm/slurm.conf:3 B=[2]",
            ],
        );
        check_files(
            &[("/e/a.conf", "include \"/x/b.conf\""), ("/x/b.conf", "include ../e/./c.conf"), ("/e/c.conf", "C=3")],
            &["/e/c.conf:1 C=[3]"],
        );
        check_files(
            &[("/e/a.conf", "Include b.conf"), ("/e/b.conf", "X=1\nInclude a.conf")],
            &["/e/b.conf:1 X=[1]", "Error /e/b.conf:2: Include /e/a.conf: include cycle, not followed"],
        );
        check_files(
            &[("/e/a.conf", "Include a.conf")],
            &["Error /e/a.conf:1: Include /e/a.conf: include cycle, not followed"],
        );
        check_files(
            &[("/e/a.conf", "A=1\nInclude missing.conf")],
            &["/e/a.conf:1 A=[1]", "Error /e/a.conf:2: Include /e/missing.conf: cannot read: not found"],
        );
        check_files(&[("/empty.conf", "")], &[]);
        let mut loader = map_loader(&[]);
        let e = load_with(Path::new("/etc/slurm/fleet.conf"), &mut loader).unwrap_err();
        assert_eq!(e.to_string(), "/etc/slurm/fleet.conf: cannot read: not found");
    }

    #[test]
    fn include_depth_is_limited() {
        // a0 includes a1 includes a2 … each a distinct file: no cycle.
        let mut loader = |p: &Path| -> io::Result<Vec<u8>> {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let n: usize = name.trim_start_matches('a').trim_end_matches(".conf").parse().unwrap_or(0);
            Ok(format!("K{n}=1\nInclude a{}.conf", n + 1).into_bytes())
        };
        let p = load_with(Path::new("/d/a0.conf"), &mut loader).unwrap();
        assert_eq!(p.entries.len(), MAX_INCLUDE_DEPTH + 1);
        assert_eq!(p.diagnostics.len(), 1);
        assert_eq!(
            p.diagnostics[0].to_string(),
            format!("/d/a{MAX_INCLUDE_DEPTH}.conf:2: Include /d/a{}.conf: includes nested deeper than {MAX_INCLUDE_DEPTH}, not followed", MAX_INCLUDE_DEPTH + 1)
        );
    }

    #[test]
    fn non_utf8_is_read_lossily_with_a_warning() {
        let mut loader = |_: &Path| -> io::Result<Vec<u8>> { Ok(b"A=\xff\nB=2".to_vec()) };
        let p = load_with(Path::new("/x.conf"), &mut loader).unwrap();
        assert_eq!(
            render(&p),
            vec![
                "/x.conf:1 A=[\u{fffd}]".to_string(),
                "/x.conf:2 B=[2]".to_string(),
                "Warning /x.conf: file is not valid UTF-8 (first bad byte at offset 2); read lossily".to_string(),
            ]
        );
        assert!(p.check().is_ok());
    }

    #[test]
    fn fs_loader_reads_real_files() {
        let dir = std::env::temp_dir().join(format!("slurm-conf-raw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("main.conf"), "A=1\nInclude sub.conf\n").unwrap();
        std::fs::write(dir.join("sub.conf"), "B=2\n").unwrap();
        let p = load_file(&dir.join("main.conf")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(p.entries.len(), 2);
        assert_eq!(p.entries[1].get("b"), Some("2"));
        assert!(p.diagnostics.is_empty());
    }
}
