//! The docs' links and the code's citations of the docs resolve.
//!
//! A newcomer reads the docs by following links, so every relative Markdown link in the docs
//! (README.md, BENCHMARKS.md, CHANGELOG.md, docs/, schema/, alerts/, deploy/README.md,
//! web/README.md) must name a file that exists and, with an `#anchor`, a heading in it (GitHub's
//! slugs). Code comments, configs and docs cite a section by path and title, as in
//! `(docs/perf/writer.md, "Folding what is held")`: every such citation of BENCHMARKS.md, a
//! docs/ page or a schema/ page must name a file with a heading of exactly that title. When the
//! docs move or a heading is renamed, these tests name each link and citation left behind.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Component, Path, PathBuf};

/// The files whose comments and text may cite a section of the docs.
const SOURCE_EXTENSIONS: [&str; 6] = ["rs", "sh", "toml", "yml", "yaml", "md"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `path` relative to the repository root, for messages.
fn shown(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

/// `a/b/../c` as `a/c`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Every file under `dir` (not target/ or hidden folders) whose extension is in `extensions`.
fn files_under(dir: &Path, extensions: &[&str], out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<_> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') && name != "node_modules" {
                files_under(&path, extensions, out);
            }
        } else if path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| extensions.contains(&e))
        {
            out.push(path);
        }
    }
}

/// The Markdown pages whose links a reader follows.
fn doc_pages() -> Vec<PathBuf> {
    let root = root();
    let top = [
        "README.md",
        "BENCHMARKS.md",
        "CHANGELOG.md",
        "deploy/README.md",
        "web/README.md",
    ];
    let mut pages: Vec<PathBuf> = top
        .iter()
        .map(|p| root.join(p))
        .filter(|p| p.is_file())
        .collect();
    files_under(&root.join("docs"), &["md"], &mut pages);
    for dir in ["schema", "alerts"] {
        let Ok(entries) = fs::read_dir(root.join(dir)) else {
            continue;
        };
        let mut found: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "md"))
            .collect();
        found.sort();
        pages.extend(found);
    }
    pages
}

/// Whether each line of a Markdown text is inside a fenced code block (the fences included).
fn fenced_lines(text: &str) -> Vec<bool> {
    let mut fence: Option<char> = None;
    text.lines()
        .map(|line| {
            let trimmed = line.trim_start();
            let marker = ['`', '~']
                .into_iter()
                .find(|&c| trimmed.starts_with(&c.to_string().repeat(3)));
            match (fence, marker) {
                (None, Some(c)) => {
                    fence = Some(c);
                    true
                }
                (Some(open), Some(c)) if open == c => {
                    fence = None;
                    true
                }
                (open, _) => open.is_some(),
            }
        })
        .collect()
}

/// The headings of a Markdown text, outside code blocks: the text after the hashes, trimmed.
fn headings(text: &str) -> Vec<String> {
    text.lines()
        .zip(fenced_lines(text))
        .filter(|(_, fenced)| !fenced)
        .filter_map(|(line, _)| {
            let hashes = line.len() - line.trim_start_matches('#').len();
            let rest = &line[hashes..];
            ((1..=6).contains(&hashes) && rest.starts_with([' ', '\t']))
                .then(|| rest.trim().to_string())
        })
        .collect()
}

/// GitHub's anchor for a heading: lowercase; letters, digits, '-' and '_' kept; spaces to '-';
/// the rest dropped.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a Markdown file's headings, a repeated one numbered as GitHub does (`-1`, ...).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    for heading in headings(text) {
        let base = slug(&heading);
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// A line with its inline code spans blanked, so that links shown as code are not followed.
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(' ');
        } else {
            out.push(if in_code { ' ' } else { c });
        }
    }
    out
}

/// The targets of the inline links (`[text](target)`, images too) and of the link definitions
/// (`[label]: target`) on one line.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut targets = Vec::new();
    if let Some(rest) = line.trim_start().strip_prefix('[')
        && let Some((_, after)) = rest.split_once("]:")
        && let Some(target) = after.split_whitespace().next()
    {
        targets.push(target.to_string());
    }
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let end = after.find(')').unwrap_or(after.len());
        let inner = after[..end].trim();
        let target = inner
            .strip_prefix('<')
            .and_then(|t| t.split_once('>'))
            .map_or_else(
                || inner.split_whitespace().next().unwrap_or_default(),
                |(t, _)| t,
            );
        targets.push(target.to_string());
        rest = &after[end..];
    }
    targets
}

/// Why a link from `page` to `target` does not resolve; `None` when it does (or is external).
fn broken_link(page: &Path, target: &str) -> Option<String> {
    if target.is_empty() {
        return Some("empty link target".into());
    }
    let lower = target.to_lowercase();
    if ["http://", "https://", "mailto:"]
        .iter()
        .any(|p| lower.starts_with(p))
    {
        return None;
    }
    let (path, anchor) = target
        .split_once('#')
        .map_or((target, None), |(p, a)| (p, Some(a)));
    let path = path.replace("%20", " ");
    let file = if path.is_empty() {
        page.to_path_buf()
    } else {
        normalize(&page.parent().unwrap_or(Path::new("")).join(&path))
    };
    if !file.exists() {
        return Some(format!("{} does not exist", shown(&file)));
    }
    let anchor = anchor.filter(|a| !a.is_empty())?;
    if file.extension().is_none_or(|e| e != "md") || file.is_dir() {
        return None;
    }
    let text = fs::read_to_string(&file).ok()?;
    (!anchors(&text).contains(&anchor.to_lowercase()))
        .then(|| format!("{} has no heading with the anchor #{anchor}", shown(&file)))
}

#[test]
fn every_link_in_the_docs_resolves() {
    let mut broken = Vec::new();
    let pages = doc_pages();
    assert!(
        pages.len() > 10,
        "only {} Markdown pages under {}",
        pages.len(),
        root().display()
    );
    for page in pages {
        let text = fs::read_to_string(&page).unwrap();
        for (n, (line, fenced)) in text.lines().zip(fenced_lines(&text)).enumerate() {
            if fenced {
                continue;
            }
            for target in link_targets(line) {
                if let Some(why) = broken_link(&page, &target) {
                    broken.push(format!(
                        "{}:{}: link ({target}): {why}",
                        shown(&page),
                        n + 1
                    ));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "{} broken link(s):\n{}",
        broken.len(),
        broken.join("\n")
    );
}

/// A line with its comment marker (`//`, `///`, `//!`, `#`) taken off, if it is a comment line;
/// a Markdown line as it is.
fn comment_text(line: &str, markdown: bool) -> Option<&str> {
    let trimmed = line.trim_start();
    if markdown {
        return Some(trimmed);
    }
    if let Some(rest) = trimmed.strip_prefix("//") {
        return Some(rest.trim_start_matches(['/', '!']).trim_start());
    }
    trimmed
        .strip_prefix('#')
        .map(|rest| rest.trim_start_matches('#').trim_start())
}

/// Whether `path` names a cited page: BENCHMARKS.md, or a page under docs/ or schema/.
fn is_cited_page(path: &str) -> bool {
    path == "BENCHMARKS.md" || path.starts_with("docs/") || path.starts_with("schema/")
}

/// One citation: the path as written, the file it names, and the heading's title.
struct Citation {
    path: String,
    file: PathBuf,
    title: String,
}

/// The citations that start in `line` (of `file`), read on into `next` where a title goes on
/// there: `PATH, "Title"`, `` `PATH`, "Title" ``, `PATH ("Title")` and `[text](PATH), "Title"`.
fn citations(file: &Path, line: &str, next: Option<&str>) -> Vec<Citation> {
    let joined = match next {
        Some(next) => format!("{line} {next}"),
        None => line.to_string(),
    };
    let text = joined.replace("\\\"", "\"");
    let starts_in_line = line.replace("\\\"", "\"").len();
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(at) = text[from..].find(".md") {
        let end = from + at + 3;
        from = end;
        if end > starts_in_line {
            break;
        }
        // The path: back to the first character that cannot be in one.
        let start = text[..end]
            .rfind(|c: char| !(c.is_ascii_alphanumeric() || "/._-".contains(c)))
            .map_or(0, |i| i + 1);
        let path = &text[start..end];
        let before = text[..start].chars().next_back();
        let mut after = &text[end..];
        let linked = before == Some('(') && text[..start].ends_with("](");
        if linked {
            // `[text](PATH#anchor)`: the citation goes on after the link.
            let Some(close) = after.find(')') else {
                continue;
            };
            after = &after[close + 1..];
        } else if before == Some('`') {
            after = after.strip_prefix('`').unwrap_or(after);
        }
        let separators = [", \"", ": \"", " (\""];
        let Some(rest) = separators.iter().find_map(|sep| after.strip_prefix(sep)) else {
            continue;
        };
        let Some(title_end) = rest.find('"') else {
            continue;
        };
        let resolved = if linked {
            normalize(&file.parent().unwrap_or(Path::new("")).join(path))
        } else if is_cited_page(path) {
            root().join(path)
        } else {
            continue;
        };
        let relative = resolved
            .strip_prefix(root())
            .map(|p| p.to_string_lossy().into_owned());
        if linked && !relative.is_ok_and(|p| is_cited_page(&p)) {
            continue;
        }
        found.push(Citation {
            path: path.to_string(),
            file: resolved,
            title: rest[..title_end]
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" "),
        });
    }
    found
}

#[test]
fn every_cited_section_exists() {
    let root = root();
    let mut files = Vec::new();
    files_under(&root, &SOURCE_EXTENSIONS, &mut files);
    let mut broken = Vec::new();
    let mut count = 0;
    for file in files {
        let Ok(text) = fs::read_to_string(&file) else {
            continue;
        };
        let markdown = file.extension().is_some_and(|e| e == "md");
        let fenced = if markdown {
            fenced_lines(&text)
        } else {
            Vec::new()
        };
        let lines: Vec<&str> = text.lines().collect();
        for (n, line) in lines.iter().enumerate() {
            if fenced.get(n).copied().unwrap_or(false) {
                continue;
            }
            let this = comment_text(line, markdown);
            let next = lines.get(n + 1).and_then(|l| comment_text(l, markdown));
            // A citation outside a comment (a string, say) is read on its own line.
            let (line_text, next) = match this {
                Some(this) => (this, next.filter(|l| !l.is_empty())),
                None => (*line, None),
            };
            for citation in citations(&file, line_text, next) {
                count += 1;
                let why = match fs::read_to_string(&citation.file) {
                    Err(_) => format!("{} does not exist", shown(&citation.file)),
                    Ok(page) if !headings(&page).contains(&citation.title) => {
                        format!(
                            "{} has no heading \"{}\"",
                            shown(&citation.file),
                            citation.title
                        )
                    }
                    Ok(_) => continue,
                };
                broken.push(format!(
                    "{}:{}: {}, \"{}\": {why}",
                    shown(&file),
                    n + 1,
                    citation.path,
                    citation.title
                ));
            }
        }
    }
    assert!(count > 0, "found no citations under {}", root.display());
    assert!(
        broken.is_empty(),
        "{} broken citation(s):\n{}",
        broken.len(),
        broken.join("\n")
    );
}
