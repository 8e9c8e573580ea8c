//! Anthropic-defined client tools: `bash_*`, `text_editor_*`, `memory_*`.
//! The client runs them (the Vercel AI SDK's and LangChain's helpers declare
//! them by `type` and `name` alone); Anthropic's API gives its models their
//! schemas. A model behind the proxy gets them as functions with the same
//! arguments, so the calls it makes are the ones the client runs.

use crate::conversation::{Description, Schema};
use crate::json::Raw;

/// The description and schema of the client tool of `kind`, if it is one.
pub fn defined(kind: &str) -> Option<(Option<Description>, Schema)> {
    let (description, schema) = match kind {
        _ if kind.starts_with("bash_") => (BASH, BASH_SCHEMA),
        // The versions before Claude 4's could undo an edit.
        "text_editor_20241022" | "text_editor_20250124" => (EDITOR_UNDO, EDITOR_UNDO_SCHEMA),
        _ if kind.starts_with("text_editor_") => (EDITOR, EDITOR_SCHEMA),
        _ if kind.starts_with("memory_") => (MEMORY, MEMORY_SCHEMA),
        _ => return None,
    };
    Some((
        Description::new(description),
        Schema::from(Raw::written(schema)),
    ))
}

const BASH: &str = "Runs a command in a persistent bash session and returns its output. \
    `restart: true` starts a new session instead.";
const BASH_SCHEMA: &str = r#"{"type":"object","properties":{"command":{"type":"string","description":"The command to run."},"restart":{"type":"boolean","description":"Restart the session."}}}"#;

/// The editor's description, and its schema with `commands` (a JSON list's
/// members) as the commands it takes: one text for both versions.
macro_rules! editor {
    () => {
        "Views, creates and edits text files. view: a file's lines, numbered \
        (view_range [first, last] for some, last -1 to the end), or a directory's listing. \
        create: a new file holding file_text. str_replace: replaces old_str, which must occur \
        exactly once, with new_str. insert: inserts new_str after line insert_line (0: at the start)."
    };
    ($commands:literal) => {
        concat!(
            r#"{"type":"object","properties":{"command":{"type":"string","enum":["#,
            $commands,
            r#"]},"path":{"type":"string","description":"Absolute path of the file or directory."},"file_text":{"type":"string"},"old_str":{"type":"string"},"new_str":{"type":"string"},"insert_line":{"type":"integer"},"view_range":{"type":"array","items":{"type":"integer"}}},"required":["command","path"]}"#
        )
    };
}
const EDITOR: &str = editor!();
const EDITOR_SCHEMA: &str = editor!(r#""view","create","str_replace","insert""#);
const EDITOR_UNDO: &str = concat!(editor!(), " undo_edit: reverts the last edit of the file.");
const EDITOR_UNDO_SCHEMA: &str = editor!(r#""view","create","str_replace","insert","undo_edit""#);

const MEMORY: &str = "Your memory: files under /memories that outlast this conversation. \
    view: a file's lines or a directory's listing (view_range [first, last]). create: a file \
    holding file_text. str_replace: old_str to new_str. insert: insert_text after line \
    insert_line. delete: a file or directory. rename: old_path to new_path.";
const MEMORY_SCHEMA: &str = r#"{"type":"object","properties":{"command":{"type":"string","enum":["view","create","str_replace","insert","delete","rename"]},"path":{"type":"string"},"file_text":{"type":"string"},"old_str":{"type":"string"},"new_str":{"type":"string"},"insert_line":{"type":"integer"},"insert_text":{"type":"string"},"old_path":{"type":"string"},"new_path":{"type":"string"},"view_range":{"type":"array","items":{"type":"integer"}}},"required":["command"]}"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_schema_is_an_object_schema_and_only_client_tools_are_known() {
        for kind in [
            "bash_20250124",
            "text_editor_20250124",
            "text_editor_20250728",
            "memory_20250818",
        ] {
            let (description, schema) = defined(kind).unwrap();
            assert!(description.is_some(), "{kind}");
            assert_eq!(schema.to_value()["type"], "object", "{kind}");
        }
        let undo = |kind| {
            defined(kind).unwrap().1.to_value()["properties"]["command"]["enum"]
                .as_array()
                .unwrap()
                .contains(&"undo_edit".into())
        };
        assert!(undo("text_editor_20250124"));
        assert!(
            !undo("text_editor_20250728"),
            "Claude 4's editor cannot undo"
        );
        // Anthropic runs these itself: the proxy cannot.
        for kind in ["web_search_20250305", "code_execution_20250825", "custom"] {
            assert!(defined(kind).is_none(), "{kind}");
        }
    }
}
