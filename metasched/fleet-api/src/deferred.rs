//! Deferred stand-ins: the stand-in itself carries the forward request.
//!
//! When the plugin cannot (or, with `ForwardMode=deferred`, need not) ask
//! the agent at submission, it rewrites a job that must leave into a
//! *deferred* stand-in whose batch script runs `fleet-proxy --deferred` and
//! embeds the whole request (script, environment, resources) after it, as
//! data that the shell never reaches. slurmctld keeps the script in its
//! state (durable, and no user can change a job's batch script), so when
//! Slurm starts the stand-in the origin agent reads the request back from
//! Slurm (`scontrol write batch_script`), never from the stand-in's body.
//!
//! The embedding is base64 (standard alphabet: `A-Z a-z 0-9 + / =`) of the
//! request's JSON, in lines of [`LINE`] characters, inside a quoted heredoc
//! whose delimiter [`END`] contains a `-`, which base64 never does: no
//! script, however hostile (the delimiter itself, NUL bytes, any size),
//! can end the data early. [`parse`] never panics and bounds what it reads.

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::JobRequest;

/// The line that opens the embedded request.
pub const BEGIN: &str = "FLEET-DEFERRED-REQUEST-V1";
/// The heredoc delimiter that closes it (a `-`: never a base64 character).
pub const END: &str = "FLEET-DEFERRED-END";
/// base64 characters per line.
pub const LINE: usize = 76;
/// Largest stand-in script [`parse`] reads (Slurm's own default
/// `max_script_size` is 4 MiB; a site may raise it up to 512 MiB).
pub const MAX_STAND_IN_BYTES: usize = 64 << 20;

/// What a deferred stand-in carries.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Payload {
    /// The fleet job id the plugin minted (`<site>-<12 hex>`), also the tag
    /// in the stand-in's `AdminComment`. An array element's fleet job is
    /// [`element_id`] of it.
    pub fleet_job_id: String,
    /// The cluster the published view pointed at (the meta-scheduler has
    /// the last word).
    pub target: String,
    /// The job as submitted, script and environment included.
    pub request: JobRequest,
}

/// Why an embedded request could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ParseError {
    TooLarge(usize),
    NoPayload,
    Unterminated,
    BadLine(usize),
    Base64(String),
    Json(String),
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParseError::TooLarge(n) => write!(f, "the stand-in script is {n} bytes, more than {MAX_STAND_IN_BYTES}"),
            ParseError::NoPayload => write!(f, "the script carries no deferred request (no {BEGIN} line)"),
            ParseError::Unterminated => write!(f, "the deferred request is not terminated by {END}"),
            ParseError::BadLine(n) => write!(f, "line {n} of the deferred request is not base64"),
            ParseError::Base64(e) => write!(f, "the deferred request is not valid base64: {e}"),
            ParseError::Json(e) => write!(f, "the deferred request does not parse: {e}"),
        }
    }
}

impl std::error::Error for ParseError {}

/// A word for a shell command line, single-quoted (`'` as `'\''`).
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The stand-in's batch script: `head` (the lines that run the proxy; it
/// must end the shell, e.g. with `exec`) followed by the payload as
/// heredoc data the shell never reads.
pub fn embed(head: &str, payload: &Payload) -> Result<String, String> {
    let json = serde_json::to_vec(payload).map_err(|e| format!("encoding the deferred request: {e}"))?;
    let b64_len = json.len().div_ceil(3) * 4;
    let mut out = String::with_capacity(head.len() + b64_len + b64_len / LINE + 128);
    out.push_str(head);
    if !head.ends_with('\n') {
        out.push('\n');
    }
    // Never reached (`head` execs), but should it be: exit before the data.
    out.push_str("exit 111\n");
    out.push_str(": <<'");
    out.push_str(END);
    out.push_str("'\n");
    out.push_str(BEGIN);
    out.push('\n');
    // Each line encodes LINE / 4 * 3 bytes (no padding but on the last):
    // the lines of one base64 string cut every LINE characters.
    const _: () = assert!(LINE.is_multiple_of(4));
    for chunk in json.chunks(LINE / 4 * 3) {
        base64::engine::general_purpose::STANDARD.encode_string(chunk, &mut out);
        out.push('\n');
    }
    out.push_str(END);
    out.push('\n');
    Ok(out)
}

fn is_b64(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=')
}

/// The payload of a stand-in script written by [`embed`]. Only the first
/// [`BEGIN`] line counts, and it must directly follow the heredoc opener
/// `embed` writes, so that text in the stand-in's head cannot pose as one.
pub fn parse(script: &[u8]) -> Result<Payload, ParseError> {
    if script.len() > MAX_STAND_IN_BYTES {
        return Err(ParseError::TooLarge(script.len()));
    }
    let opener = format!(": <<'{END}'");
    let mut lines = script.split(|&b| b == b'\n').enumerate();
    // The opener and the BEGIN line, adjacent.
    let mut prev_opener = false;
    let mut found = false;
    for (_, line) in lines.by_ref() {
        if prev_opener && line == BEGIN.as_bytes() {
            found = true;
            break;
        }
        prev_opener = line == opener.as_bytes();
    }
    if !found {
        return Err(ParseError::NoPayload);
    }
    let mut b64 = Vec::new();
    let mut terminated = false;
    let mut lines = lines.peekable();
    while let Some((n, line)) = lines.next() {
        if line == END.as_bytes() {
            terminated = true;
            break;
        }
        // The script's end (after its last newline) without the delimiter.
        if line.is_empty() && lines.peek().is_none() {
            break;
        }
        if line.is_empty() || line.len() > LINE || !line.iter().all(|&b| is_b64(b)) {
            return Err(ParseError::BadLine(n + 1));
        }
        b64.extend_from_slice(line);
    }
    if !terminated {
        return Err(ParseError::Unterminated);
    }
    let json = base64::engine::general_purpose::STANDARD.decode(&b64).map_err(|e| ParseError::Base64(e.to_string()))?;
    serde_json::from_slice(&json).map_err(|e| ParseError::Json(e.to_string()))
}

/// The fleet job id of element `task` of a deferred array stand-in tagged
/// `base` (each element is a fleet job of its own).
pub fn element_id(base: &str, task: u32) -> String {
    format!("{base}_{task}")
}

/// The variables Slurm sets for an array element, as the proxy (running
/// as that element) passes them on; only these names, with decimal values,
/// are taken from the proxy.
pub const ARRAY_VARS: &[&str] = &[
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_ARRAY_TASK_COUNT",
    "SLURM_ARRAY_TASK_MIN",
    "SLURM_ARRAY_TASK_MAX",
    "SLURM_ARRAY_TASK_STEP",
];

/// `NAME=value` entries of [`ARRAY_VARS`] with decimal values, from any
/// list (the proxy's environment): everything else is dropped.
pub fn array_vars<'a>(env: impl IntoIterator<Item = &'a str>) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = Vec::new();
    for e in env {
        let Some((k, v)) = e.split_once('=') else { continue };
        if !ARRAY_VARS.contains(&k) || out.iter().any(|(n, _)| n == k) {
            continue;
        }
        if v.is_empty() || v.len() > 10 || !v.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        if let Ok(n) = v.parse() {
            out.push((k.to_string(), n));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(script: &[u8]) -> Payload {
        Payload {
            fleet_job_id: "beta-00ab12cd34ef".into(),
            target: "alpha".into(),
            request: JobRequest {
                origin: "beta".into(),
                user_id: 1001,
                script: Some(script.to_vec()),
                env: vec!["PATH=/usr/bin".into(), format!("X={END}")],
                ..Default::default()
            },
        }
    }

    const HEAD: &str = "#!/bin/sh\nexec '/usr/libexec/fleet/fleet-proxy' --deferred\n";

    fn round_trip(script: &[u8]) {
        let p = payload(script);
        let s = embed(HEAD, &p).unwrap();
        // The payload is the request's base64, cut every LINE characters.
        let b64 = base64::engine::general_purpose::STANDARD.encode(serde_json::to_vec(&p).unwrap());
        let lines: Vec<&str> = b64.as_bytes().chunks(LINE).map(|c| std::str::from_utf8(c).unwrap()).collect();
        assert_eq!(s, format!("{HEAD}exit 111\n: <<'{END}'\n{BEGIN}\n{}\n{END}\n", lines.join("\n")));
        assert!(s.starts_with(HEAD));
        assert_eq!(parse(s.as_bytes()).unwrap(), p);
        // The delimiter appears exactly once as a whole line after the opener.
        assert_eq!(s.lines().filter(|l| *l == END).count(), 1);
    }

    #[test]
    fn hostile_scripts_round_trip() {
        round_trip(b"#!/bin/bash\necho hi\n");
        round_trip(format!("#!/bin/sh\ncat <<'{END}'\n{END}\n{BEGIN}\nAAAA\n{END}\nexit 3\n").as_bytes());
        round_trip(b"#!/bin/sh\n\0\0echo \x00nul\xff\xfe not utf-8\n");
        round_trip(b"");
        round_trip(&vec![b'\n'; 1000]);
        // Huge (2 MiB of every byte value).
        let big: Vec<u8> = (0..(2u32 << 20)).map(|i| (i % 251) as u8).collect();
        round_trip(&big);
    }

    #[test]
    fn shell_quoting() {
        assert_eq!(shell_quote("/a b/c"), "'/a b/c'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }

    fn check_err(script: &str, want: fn(&ParseError) -> bool) {
        let e = parse(script.as_bytes()).unwrap_err();
        assert!(want(&e), "{script:?}: {e:?}");
    }

    #[test]
    fn malformed_payloads_are_errors() {
        let good = embed(HEAD, &payload(b"echo")).unwrap();
        check_err("#!/bin/sh\necho plain job\n", |e| matches!(e, ParseError::NoPayload));
        // A BEGIN line not right after the opener (e.g. in the head) is not a payload.
        check_err(&format!("#!/bin/sh\n{BEGIN}\nAAAA\n{END}\n"), |e| matches!(e, ParseError::NoPayload));
        check_err(&good.replace(&format!("\n{END}\n"), "\n"), |e| matches!(e, ParseError::Unterminated));
        let bad_line = good.replacen(&format!("{BEGIN}\n"), &format!("{BEGIN}\nnot base64!\n"), 1);
        check_err(&bad_line, |e| matches!(e, ParseError::BadLine(_)));
        let empty_line = good.replacen(&format!("{BEGIN}\n"), &format!("{BEGIN}\n\n"), 1);
        check_err(&empty_line, |e| matches!(e, ParseError::BadLine(_)));
        let not_json = embed_raw(b"{not json");
        check_err(&not_json, |e| matches!(e, ParseError::Json(_)));
        check_err(&format!(": <<'{END}'\n{BEGIN}\nA\n{END}\n"), |e| matches!(e, ParseError::Base64(_)));
        let huge = vec![b'A'; MAX_STAND_IN_BYTES + 1];
        assert_eq!(parse(&huge), Err(ParseError::TooLarge(MAX_STAND_IN_BYTES + 1)));
    }

    fn embed_raw(json: &[u8]) -> String {
        let b64 = base64::engine::general_purpose::STANDARD.encode(json);
        format!("{HEAD}exit 111\n: <<'{END}'\n{BEGIN}\n{b64}\n{END}\n")
    }

    #[test]
    fn array_variables_only_decimal_and_known() {
        let env = [
            "SLURM_ARRAY_JOB_ID=41",
            "SLURM_ARRAY_TASK_ID=3",
            "SLURM_ARRAY_TASK_ID=9",
            "SLURM_ARRAY_TASK_COUNT=6",
            "SLURM_ARRAY_TASK_MIN=-1",
            "SLURM_ARRAY_TASK_MAX=5 ; rm -rf",
            "SLURM_ARRAY_TASK_STEP=99999999999",
            "LD_PRELOAD=/tmp/x.so",
            "garbage",
        ];
        assert_eq!(
            array_vars(env),
            vec![
                ("SLURM_ARRAY_JOB_ID".to_string(), 41),
                ("SLURM_ARRAY_TASK_ID".to_string(), 3),
                ("SLURM_ARRAY_TASK_COUNT".to_string(), 6)
            ]
        );
        assert_eq!(element_id("beta-1", 4), "beta-1_4");
    }

    proptest::proptest! {
        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..4096)) {
            let _ = parse(&bytes);
            // Nor with a plausible frame around arbitrary lines.
            let mut framed = format!(": <<'{END}'\n{BEGIN}\n").into_bytes();
            framed.extend_from_slice(&bytes);
            let _ = parse(&framed);
        }

        #[test]
        fn any_script_round_trips(script in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..2048)) {
            let p = payload(&script);
            proptest::prop_assert_eq!(parse(embed(HEAD, &p).unwrap().as_bytes()).unwrap(), p);
        }
    }
}
