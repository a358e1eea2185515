//! `toolloop run --attach FILE|URL`: images go with the prompt to every provider, are kept in
//! the session, and a file that is not an image is a usage error before any model call.

use crate::common;
use common::{json_of, mock, repo, toolloop};

/// The eight bytes that open every PNG file, then the start of its header chunk.
const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0";

#[test]
fn attached_images_reach_every_provider_and_stay_in_the_session() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt);
    let base = server.base_url();
    let dir = repo();
    std::fs::write(dir.path().join("shot.png"), PNG).unwrap();
    for (provider, url) in [
        ("openai", format!("{base}/v1")),
        ("openai-responses", format!("{base}/v1")),
        ("anthropic", base.clone()),
        ("gemini", base.clone()),
    ] {
        let model = format!("{provider}:mock:rounds=1");
        let session = format!("attach-{provider}");
        let out = toolloop(
            &[
                "run",
                "--json",
                "--model",
                &model,
                "--base-url",
                &url,
                "--session",
                &session,
                "--attach",
                "shot.png",
                "-a",
                "https://example.com/chart.jpg",
                "What changed?",
            ],
            dir.path(),
        );
        assert_eq!(
            out.status.code(),
            Some(0),
            "{provider}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v = json_of(&out);
        assert_eq!(
            v["text"], "Done. I saw 1 tool results in 1 rounds. I see 2 images.",
            "{provider}"
        );
        // The session keeps the images with the prompt, and shows them.
        let out = toolloop(&["sessions", "show", &session], dir.path());
        let shown = String::from_utf8_lossy(&out.stdout);
        assert!(
            shown.contains(&format!("user: [image: image/png, {} bytes]", PNG.len())),
            "{shown}"
        );
        assert!(
            shown.contains("user: [image: https://example.com/chart.jpg]"),
            "{shown}"
        );
    }
    assert_eq!(server.stats().rejected, 0);
    rt.block_on(server.shutdown());
}

#[test]
fn what_is_not_an_image_is_refused_before_any_model_call() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = mock(&rt);
    let url = format!("{}/v1", server.base_url());
    let dir = repo();
    for (attach, expected) in [
        (
            "README.md",
            "README.md is not a PNG, JPEG, GIF or WebP image",
        ),
        ("missing.png", "cannot read the image missing.png"),
        ("ftp://example.com/a.png", "is not an image URL"),
        ("data:text/plain;base64,aGk=", "is not an image URL"),
    ] {
        let out = toolloop(
            &[
                "run",
                "--model",
                "openai:mock",
                "--base-url",
                &url,
                "--attach",
                attach,
                "hi",
            ],
            dir.path(),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{attach}: {stderr}");
        assert!(
            stderr.contains("--attach") && stderr.contains(expected),
            "{attach}: {stderr}"
        );
    }
    assert_eq!(server.stats().requests, 0);
    rt.block_on(server.shutdown());
}
