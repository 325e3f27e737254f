//! Issue 44: the manual is a tree (README.md, CONTRIBUTING.md, docs/), so a page moved or a
//! heading renamed must not leave a link pointing nowhere. Every relative link resolves to a
//! file, and every `#anchor` to a heading of its file by GitHub's slug rule. No network (links
//! with a scheme are not followed), no mail host.

mod support;

use std::path::{Path, PathBuf};

use support::{anchors, broken_links, links, markdown_under, slug};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The manual: the two top pages and everything under docs/.
fn manual(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md"), root.join("CONTRIBUTING.md")];
    files.extend(markdown_under(&root.join("docs")));
    files
}

#[test]
fn every_link_and_anchor_of_the_manual_resolves() {
    let files = manual(&repo());
    assert!(files.len() >= 14, "the manual's pages: {files:?}");
    let broken: Vec<String> = files
        .iter()
        .flat_map(|f| broken_links(f))
        .map(|b| b.to_string())
        .collect();
    assert!(
        broken.is_empty(),
        "{} broken link(s):\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn the_readme_stays_short_and_opens_with_the_two_commands() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(lines <= 300, "README.md has {lines} lines (at most 300)");
    let first: Vec<&str> = readme.lines().take(6).collect();
    let opening = first.join("\n");
    assert!(
        opening.contains("scripts/demo.sh") && opening.contains("scripts/test.sh"),
        "the README opens with the two commands that set everything up:\n{opening}"
    );
}

#[test]
fn slugs_follow_githubs_rule() {
    assert_eq!(slug("Security model"), "security-model");
    assert_eq!(
        slug("Results: fields and files"),
        "results-fields-and-files"
    );
    assert_eq!(
        slug("ASMTP mailboxes (Agent Simple Mail Transfer Protocol)"),
        "asmtp-mailboxes-agent-simple-mail-transfer-protocol"
    );
    assert_eq!(slug("The `[ui]` table"), "the-ui-table");
    assert_eq!(
        slug("Keys of_a kind - and more"),
        "keys-of_a-kind---and-more"
    );
    assert_eq!(slug("Über [links](x.md)"), "über-links");
}

#[test]
fn anchors_number_repeated_headings_and_read_a_ids() {
    let text =
        "# Top\n## Notes\n```sh\n# not a heading\n```\n## Notes\nA <a id=\"kept-here\"></a>x\n";
    let found = anchors(text);
    for a in ["top", "notes", "notes-1", "kept-here"] {
        assert!(found.contains(a), "{a} in {found:?}");
    }
    assert!(!found.contains("not-a-heading"), "{found:?}");
}

#[test]
fn links_in_code_are_not_links() {
    let text = "See [a](a.md) and `[b](b.md)`.\n```md\n[c](c.md)\n```\n![img](i.png)\n";
    let found: Vec<String> = links(text).into_iter().map(|(_, t)| t).collect();
    assert_eq!(found, ["a.md", "i.png"]);
}

/// The check itself fails on each kind of broken link: a missing file, a missing anchor in
/// another file, a missing anchor in the same file, an absolute path.
#[test]
fn a_broken_link_is_found() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("docs")).unwrap();
    std::fs::write(
        dir.path().join("docs/page.md"),
        "# Page\n## A section\n<a id=\"spot\"></a>\n",
    )
    .unwrap();
    let top = dir.path().join("README.md");
    std::fs::write(
        &top,
        "# Top\n\
         [ok](docs/page.md) [ok](docs/page.md#a-section) [ok](docs/page.md#spot) [ok](#top)\n\
         [web](https://example.com/x#y)\n\
         [gone](docs/gone.md)\n\
         [no anchor](docs/page.md#another-section)\n\
         [here](#nowhere)\n\
         [abs](/usr/share/doc/x.md)\n",
    )
    .unwrap();
    let broken = broken_links(&top);
    let targets: Vec<(usize, &str)> = broken.iter().map(|b| (b.line, b.target.as_str())).collect();
    assert_eq!(
        targets,
        [
            (4, "docs/gone.md"),
            (5, "docs/page.md#another-section"),
            (6, "#nowhere"),
            (7, "/usr/share/doc/x.md"),
        ],
        "{broken:#?}"
    );
}
