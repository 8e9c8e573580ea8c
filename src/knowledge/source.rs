//! Where a knowledge base's documents come from: files and globs relative
//! to the config file's directory, and `http(s)://` URLs fetched at build
//! time; text, Markdown, and PDF (its text, by `pdf-extract`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use tracing::warn;

use crate::http_client::{Endpoint, EndpointOptions, Request, Timeouts};

/// A source larger than this is skipped (logged).
const MAX_BYTES: usize = 32 << 20;
/// One URL's fetch, whole.
const FETCH_WAIT: Duration = Duration::from_secs(60);

/// One document's text and what the search results call it.
pub struct Document {
    pub label: String,
    pub text: String,
}

pub fn is_url(source: &str) -> bool {
    source.starts_with("http://") || source.starts_with("https://")
}

/// The documents of the file and glob sources, each file once, and how
/// many sources could not be read (a glob matching nothing, an unreadable
/// file: perhaps a volume not mounted yet). Blocking.
pub fn read_files(base: &str, dir: &Path, sources: &[String]) -> (Vec<Document>, usize) {
    let mut failed = 0;
    // Each file with its label: its path from the config's directory, or
    // for a file outside it, from the glob's fixed part.
    let mut files: Vec<(PathBuf, String)> = Vec::new();
    for source in sources.iter().filter(|s| !is_url(s)) {
        let pattern = dir.join(source);
        let fixed: PathBuf = pattern
            .components()
            .take_while(|c| !c.as_os_str().to_string_lossy().contains(['*', '?', '[']))
            .collect();
        let found: Vec<PathBuf> = match glob::glob(&pattern.to_string_lossy()) {
            Ok(paths) => paths.flatten().filter(|p| p.is_file()).collect(),
            Err(e) => {
                warn!(base, source, error = %e, "not a valid glob");
                failed += 1;
                continue;
            }
        };
        if found.is_empty() {
            warn!(base, source, "knowledge source matches no file");
            failed += 1;
        }
        for file in found {
            if files.iter().all(|(f, _)| *f != file) {
                let from = if file.starts_with(dir) {
                    dir
                } else {
                    fixed.as_path()
                };
                let label = file
                    .strip_prefix(from)
                    .unwrap_or(&file)
                    .to_string_lossy()
                    .into_owned();
                files.push((file, label));
            }
        }
    }
    let documents = files
        .into_iter()
        .filter_map(|(file, label)| {
            let bytes = match std::fs::metadata(&file) {
                Ok(meta) if meta.len() > MAX_BYTES as u64 => {
                    warn!(base, file = %label, bytes = meta.len(), "knowledge source skipped: larger than 32 MiB");
                    return None;
                }
                Ok(_) => std::fs::read(&file),
                Err(e) => Err(e),
            };
            let bytes = bytes
                .inspect_err(|e| {
                    warn!(base, file = %label, error = %e, "knowledge source unreadable");
                    failed += 1;
                })
                .ok()?;
            let pdf = file.extension().is_some_and(|e| e.eq_ignore_ascii_case("pdf"));
            let text = text_of(base, &label, &bytes, pdf)?;
            Some(Document { label, text })
        })
        .collect();
    (documents, failed)
}

/// The documents of the URL sources, and how many could not be fetched
/// (left out and logged, as a missing file is).
pub async fn fetch_urls(base: &str, sources: &[String]) -> (Vec<Document>, usize) {
    let mut documents = Vec::new();
    let mut failed = 0;
    for url in sources.iter().filter(|s| is_url(s)) {
        match tokio::time::timeout(FETCH_WAIT, fetch(url)).await {
            Ok(Ok((bytes, content_type))) => {
                let pdf =
                    content_type.contains("pdf") || url.to_ascii_lowercase().ends_with(".pdf");
                if content_type.contains("html") {
                    warn!(base, url, "knowledge source skipped: an HTML page (give the raw text, Markdown or PDF)");
                    continue;
                }
                // Off the runtime: a PDF's text extraction is CPU work.
                let (name, label) = (base.to_owned(), url.clone());
                let text = tokio::task::spawn_blocking(move || text_of(&name, &label, &bytes, pdf))
                    .await
                    .ok()
                    .flatten();
                if let Some(text) = text {
                    documents.push(Document {
                        label: url.clone(),
                        text,
                    });
                }
            }
            Ok(Err(reason)) => {
                warn!(base, url, %reason, "knowledge source not fetched");
                failed += 1;
            }
            Err(_) => {
                warn!(base, url, "knowledge source not fetched: timed out");
                failed += 1;
            }
        }
    }
    (documents, failed)
}

/// `GET url`: the body and its content type (lowercase, possibly empty).
async fn fetch(url: &str) -> Result<(Vec<u8>, String), String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("invalid URL: {e}"))?;
    let origin = format!(
        "{}://{}",
        uri.scheme_str().unwrap_or_default(),
        uri.authority().map_or("", |a| a.as_str())
    );
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let options = EndpointOptions {
        timeouts: Timeouts::all(FETCH_WAIT),
        ca_file: None,
    };
    let endpoint = Endpoint::parse(&origin, options)?;
    let request = Request::new("GET", path).map_err(|e| e.to_string())?;
    let mut exchange = endpoint
        .send(request, None)
        .await
        .map_err(|e| e.etype().as_str().to_owned())?;
    let status = exchange.status();
    if !(200..300).contains(&status) {
        return Err(format!("HTTP {status}"));
    }
    let content_type = exchange
        .field(&http::header::CONTENT_TYPE)
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_ascii_lowercase();
    let body = exchange
        .read_to_end(MAX_BYTES)
        .await
        .map_err(|e| e.etype().as_str().to_owned())?;
    Ok((body.to_vec(), content_type))
}

/// A document's text: a PDF's extracted, anything else read as UTF-8
/// (lossy). `None` for a PDF that yields none (logged).
fn text_of(base: &str, label: &str, bytes: &[u8], pdf: bool) -> Option<String> {
    let text = if pdf {
        pdf_text(base, label, bytes)?
    } else {
        String::from_utf8_lossy(bytes).into_owned()
    };
    // NUL bytes (a binary or UTF-16 file) mean nothing to a model, and
    // Postgres's text cannot hold them.
    Some(if text.contains('\0') {
        text.replace('\0', "")
    } else {
        text
    })
}

#[cfg(feature = "pdf")]
fn pdf_text(base: &str, label: &str, bytes: &[u8]) -> Option<String> {
    // pdf-extract panics on some malformed files: a bad file is skipped,
    // the build goes on.
    let extracted = std::panic::catch_unwind(|| pdf_extract::extract_text_from_mem(bytes));
    match extracted {
        Ok(Ok(text)) if !text.trim().is_empty() => Some(text),
        Ok(Ok(_)) => {
            warn!(
                base,
                source = label,
                "knowledge source skipped: a PDF without text (scanned?)"
            );
            None
        }
        Ok(Err(e)) => {
            warn!(base, source = label, error = %e, "knowledge source skipped: unreadable PDF");
            None
        }
        Err(_) => {
            warn!(
                base,
                source = label,
                "knowledge source skipped: the PDF could not be parsed"
            );
            None
        }
    }
}

#[cfg(not(feature = "pdf"))]
fn pdf_text(base: &str, label: &str, _bytes: &[u8]) -> Option<String> {
    warn!(base, source = label, "knowledge source skipped: a PDF, and this build has no PDF support (build with the `pdf` feature)");
    None
}
