//! Images in user messages: read from a file, given as bytes, or pointed to by a URL.
//!
//! ```
//! use toolloop::image::Image;
//! use toolloop::Message;
//!
//! // The eight bytes that open every PNG file, standing in for a real one.
//! let png = Image::from_bytes(b"\x89PNG\r\n\x1a\n").unwrap();
//! assert_eq!(png.media_type(), Some("image/png"));
//! let chart = Image::from_url("https://example.com/chart.jpg").unwrap();
//! let turn = Message::user_with_images("What changed between these two?", [png, chart]);
//! assert_eq!(turn.images().len(), 2);
//! ```
//!
//! Every adapter sends them in its API's own form: OpenAI Chat Completions `image_url` parts,
//! Responses `input_image`, Anthropic `image` blocks, Gemini `inlineData` and `fileData` parts.
//! Prompt-based tool calling passes them on to the model beneath it. A model that cannot see
//! images answers with an error, which ends the run as any model error does.
//!
//! The bytes of an image are kept base64-encoded, the form every API takes, so a transcript
//! that holds images is saved and sent without encoding them again. Its serde form is
//! `{"media_type": "image/png", "data": "iVBORw0…"}` or `{"url": "https://…"}`.

use std::io::Read;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Serialize};

/// An image in a user message.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Image {
    /// The image's media type (`image/png`); for a URL, the one its file extension names, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    media_type: Option<String>,
    /// Where the image is.
    #[serde(flatten)]
    source: ImageSource,
}

/// Where an image's bytes are.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageSource {
    /// The image itself, base64-encoded (standard alphabet, with padding).
    Data(String),
    /// An `http` or `https` URL the provider fetches.
    Url(String),
}

/// Why an image could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// The file could not be read.
    #[error("cannot read the image {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        #[source]
        source: std::io::Error,
    },
    /// The image is larger than [`Image::MAX_BYTES`].
    #[error("the image{} is {size} bytes, more than the {limit} bytes a provider takes", .path.as_ref().map(|p| format!(" {}", p.display())).unwrap_or_default())]
    TooLarge {
        /// The file, when it came from one.
        path: Option<PathBuf>,
        /// Its size in bytes.
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// The bytes are not a PNG, JPEG, GIF or WebP image.
    #[error("{} is not a PNG, JPEG, GIF or WebP image", .path.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "the data".into()))]
    NotAnImage {
        /// The file, when it came from one.
        path: Option<PathBuf>,
    },
    /// The media type given is not an image type.
    #[error("`{0}` is not an image media type (expected `image/…`)")]
    MediaType(String),
    /// The URL is not an `http`, `https` or `data:` URL of an image.
    #[error("`{url}` is not an image URL: {reason}")]
    Url {
        /// The URL (a `data:` URL cut short).
        url: String,
        /// What is wrong with it.
        reason: String,
    },
}

impl Image {
    /// The largest image, in bytes, that [`Image::from_file`] and [`Image::from_bytes`] accept:
    /// 20 MiB, the most any of the providers takes in one request.
    pub const MAX_BYTES: u64 = 20 * 1024 * 1024;

    /// An image from its bytes; its type (PNG, JPEG, GIF or WebP) is read from its first bytes.
    pub fn from_bytes(bytes: &[u8]) -> Result<Image, ImageError> {
        check_size(bytes.len() as u64, None)?;
        let media_type = sniff(bytes).ok_or(ImageError::NotAnImage { path: None })?;
        Ok(Image::encoded(bytes, media_type.to_string()))
    }

    /// An image from its bytes and its media type (`image/heic`, say, which
    /// [`Image::from_bytes`] does not recognise).
    pub fn from_bytes_with_type(
        bytes: &[u8],
        media_type: impl Into<String>,
    ) -> Result<Image, ImageError> {
        check_size(bytes.len() as u64, None)?;
        let media_type = media_type.into();
        if !is_image_type(&media_type) {
            return Err(ImageError::MediaType(media_type));
        }
        Ok(Image::encoded(bytes, media_type))
    }

    /// An image from base64 text (standard alphabet), as MCP servers and APIs send images:
    /// its type (PNG, JPEG, GIF or WebP) is read from its bytes, whatever the sender declared
    /// (the providers refuse an image whose declared type is not its own).
    pub fn from_base64(data: &str) -> Result<Image, ImageError> {
        let bytes = STANDARD
            .decode(data.trim())
            .map_err(|_| ImageError::NotAnImage { path: None })?;
        Image::from_bytes(&bytes)
    }

    /// An image read from a file (PNG, JPEG, GIF or WebP, recognised by its first bytes, not its
    /// name), of at most [`Image::MAX_BYTES`].
    pub fn from_file(path: impl AsRef<Path>) -> Result<Image, ImageError> {
        let path = path.as_ref();
        let read = |source| ImageError::Read {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(read)?;
        let mut bytes = Vec::new();
        // One byte past the limit tells a file that is too large without reading all of it.
        file.take(Image::MAX_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(read)?;
        check_size(bytes.len() as u64, Some(path))?;
        let media_type = sniff(&bytes).ok_or_else(|| ImageError::NotAnImage {
            path: Some(path.to_path_buf()),
        })?;
        Ok(Image::encoded(&bytes, media_type.to_string()))
    }

    /// An image at a URL: `http://` or `https://` (the provider fetches it; its media type is
    /// the one its extension names, when it has one of `.png`, `.jpg`, `.jpeg`, `.gif`,
    /// `.webp`), or a `data:image/…;base64,…` URL (decoded and checked here).
    pub fn from_url(url: &str) -> Result<Image, ImageError> {
        let bad = |reason: &str| ImageError::Url {
            url: url.chars().take(80).collect(),
            reason: reason.to_string(),
        };
        if let Some(rest) = strip_prefix_ignore_case(url, "data:") {
            let (header, data) = rest
                .split_once(',')
                .ok_or_else(|| bad("a data URL needs a comma before its data"))?;
            let media_type = header
                .strip_suffix(";base64")
                .ok_or_else(|| bad("only base64 data URLs are taken"))?;
            if !is_image_type(media_type) {
                return Err(bad("its media type is not `image/…`"));
            }
            let bytes = STANDARD
                .decode(data.trim())
                .map_err(|e| bad(&format!("its data is not base64 ({e})")))?;
            return Image::from_bytes_with_type(&bytes, media_type);
        }
        let scheme_ok = ["http://", "https://"]
            .iter()
            .any(|s| strip_prefix_ignore_case(url, s).is_some_and(|rest| !rest.is_empty()));
        if !scheme_ok {
            return Err(bad("expected an http, https or data: URL"));
        }
        if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad("it holds spaces or control characters"));
        }
        let path = url.split(['?', '#']).next().unwrap_or(url);
        let extension = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
        let media_type = match extension.as_deref() {
            Some("png") => Some("image/png"),
            Some("jpg" | "jpeg") => Some("image/jpeg"),
            Some("gif") => Some("image/gif"),
            Some("webp") => Some("image/webp"),
            _ => None,
        };
        Ok(Image {
            media_type: media_type.map(str::to_string),
            source: ImageSource::Url(url.to_string()),
        })
    }

    fn encoded(bytes: &[u8], media_type: String) -> Image {
        Image {
            media_type: Some(media_type),
            source: ImageSource::Data(STANDARD.encode(bytes)),
        }
    }

    /// The media type, when known (always, for an image given by its bytes).
    pub fn media_type(&self) -> Option<&str> {
        self.media_type.as_deref()
    }

    /// Where the image is.
    pub fn source(&self) -> &ImageSource {
        &self.source
    }

    /// The image as one URL: a `data:` URL for an image given by its bytes (what the OpenAI
    /// APIs take), else its URL.
    pub fn url(&self) -> String {
        match &self.source {
            ImageSource::Data(data) => format!(
                "data:{};base64,{data}",
                self.media_type
                    .as_deref()
                    .unwrap_or("application/octet-stream")
            ),
            ImageSource::Url(url) => url.clone(),
        }
    }

    /// The image's bytes, for an image given by its bytes (none for a URL, or for data that is
    /// not valid base64, as a transcript loaded from elsewhere may hold).
    pub fn bytes(&self) -> Option<Vec<u8>> {
        match &self.source {
            ImageSource::Data(data) => STANDARD.decode(data).ok(),
            ImageSource::Url(_) => None,
        }
    }

    /// A short description for people: `image/png, 1234 bytes`, or the URL.
    pub fn describe(&self) -> String {
        match &self.source {
            ImageSource::Data(data) => format!(
                "{}, {} bytes",
                self.media_type.as_deref().unwrap_or("image"),
                decoded_len(data)
            ),
            ImageSource::Url(url) => url.clone(),
        }
    }
}

fn check_size(size: u64, path: Option<&Path>) -> Result<(), ImageError> {
    if size > Image::MAX_BYTES {
        return Err(ImageError::TooLarge {
            path: path.map(Path::to_path_buf),
            size,
            limit: Image::MAX_BYTES,
        });
    }
    Ok(())
}

/// The size of the bytes a base64 text encodes.
fn decoded_len(data: &str) -> usize {
    let padding = data.bytes().rev().take_while(|&b| b == b'=').count();
    (data.len() / 4 * 3).saturating_sub(padding.min(2))
}

fn is_image_type(media_type: &str) -> bool {
    strip_prefix_ignore_case(media_type, "image/").is_some_and(|sub| {
        !sub.is_empty()
            && sub
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
    })
}

fn strip_prefix_ignore_case<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

/// The media type an image's first bytes show: PNG, JPEG, GIF or WebP.
pub fn sniff(bytes: &[u8]) -> Option<&'static str> {
    if bytes.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if bytes.starts_with(b"\xff\xd8\xff") {
        Some("image/jpeg")
    } else if bytes.starts_with(b"GIF87a") || bytes.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if bytes.len() >= 12 && bytes.starts_with(b"RIFF") && &bytes[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";

    #[test]
    fn types_are_read_from_the_bytes() {
        assert_eq!(sniff(PNG), Some("image/png"));
        assert_eq!(sniff(b"\xff\xd8\xff\xe0"), Some("image/jpeg"));
        assert_eq!(sniff(b"GIF89a.."), Some("image/gif"));
        assert_eq!(sniff(b"RIFF\0\0\0\0WEBPVP8 "), Some("image/webp"));
        assert_eq!(sniff(b"RIFF\0\0\0\0WAVE"), None);
        assert_eq!(sniff(b"%PDF-1.7"), None);
        assert!(matches!(
            Image::from_bytes(b"hello"),
            Err(ImageError::NotAnImage { path: None })
        ));
    }

    #[test]
    fn bytes_become_a_data_url_and_back() {
        let image = Image::from_bytes(PNG).unwrap();
        let url = image.url();
        assert!(url.starts_with("data:image/png;base64,"), "{url}");
        assert_eq!(Image::from_url(&url).unwrap(), image);
        assert_eq!(image.describe(), format!("image/png, {} bytes", PNG.len()));
        assert_eq!(image.bytes().as_deref(), Some(PNG));
    }

    #[test]
    fn urls_are_checked() {
        let image = Image::from_url("https://example.com/a/chart.JPG?size=2").unwrap();
        assert_eq!(image.media_type(), Some("image/jpeg"));
        assert_eq!(
            Image::from_url("http://example.com/x")
                .unwrap()
                .media_type(),
            None
        );
        for bad in [
            "file:///etc/passwd",
            "ftp://example.com/a.png",
            "https://",
            "https://example.com/a b.png",
            "data:text/plain;base64,aGk=",
            "data:image/png,rawtext",
            "data:image/png;base64,***",
            "chart.png",
        ] {
            assert!(
                matches!(Image::from_url(bad), Err(ImageError::Url { .. })),
                "{bad}"
            );
        }
    }

    #[test]
    fn files_are_read_and_limited() {
        let dir = tempfile::tempdir().unwrap();
        let png = dir.path().join("shot.bin");
        std::fs::write(&png, PNG).unwrap();
        assert_eq!(
            Image::from_file(&png).unwrap().media_type(),
            Some("image/png")
        );
        let text = dir.path().join("notes.png");
        std::fs::write(&text, "not an image").unwrap();
        let err = Image::from_file(&text).unwrap_err();
        assert!(err.to_string().contains("notes.png"), "{err}");
        let big = dir.path().join("big.png");
        let file = std::fs::File::create(&big).unwrap();
        file.set_len(Image::MAX_BYTES + 10).unwrap();
        assert!(matches!(
            Image::from_file(&big),
            Err(ImageError::TooLarge { .. })
        ));
        assert!(matches!(
            Image::from_file(dir.path().join("missing.png")),
            Err(ImageError::Read { .. })
        ));
    }

    #[test]
    fn media_types_must_be_images() {
        assert!(Image::from_bytes_with_type(b"x", "image/heic").is_ok());
        for bad in ["text/plain", "image/", "image/a b", "png"] {
            assert!(
                matches!(
                    Image::from_bytes_with_type(b"x", bad),
                    Err(ImageError::MediaType(_))
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn serde_form_is_documented() {
        let image = Image::from_bytes(PNG).unwrap();
        let v = serde_json::to_value(&image).unwrap();
        assert_eq!(v["media_type"], "image/png");
        assert!(v["data"].is_string());
        let url = Image::from_url("https://example.com/x").unwrap();
        assert_eq!(
            serde_json::to_value(&url).unwrap(),
            serde_json::json!({"url": "https://example.com/x"})
        );
    }

    proptest! {
        #[test]
        fn arbitrary_urls_never_panic(url in ".{0,40}", bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = Image::from_url(&url);
            let _ = Image::from_url(&format!("data:{url}"));
            let _ = Image::from_url(&format!("data:image/png;base64,{url}"));
            if let Ok(image) = Image::from_bytes(&bytes) {
                prop_assert_eq!(Image::from_url(&image.url()).unwrap(), image.clone());
                prop_assert_eq!(image.describe(), format!("{}, {} bytes", image.media_type().unwrap(), bytes.len()));
            }
        }
    }
}
