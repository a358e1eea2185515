//! Images in requests, checked as the APIs check them: a `data:` URL or base64 data must decode
//! to an image of the media type it declares, and a URL must be `http` or `https` (the mock
//! fetches nothing). The protocol modules count the images of the task's user turns, and the
//! final answer says how many it saw.

use toolloop::image::{Image, ImageSource, sniff};

/// Checks an image given as one URL (OpenAI's two APIs): a `data:image/…;base64,…` URL or an
/// `http(s)` URL.
pub(crate) fn check_url(url: &str) -> Result<(), String> {
    let image = Image::from_url(url).map_err(|e| e.to_string())?;
    if let ImageSource::Data(_) = image.source() {
        let bytes = image.bytes().unwrap_or_default();
        let declared = image.media_type().unwrap_or("");
        match sniff(&bytes) {
            Some(found) if found.eq_ignore_ascii_case(declared) => {}
            Some(found) => {
                return Err(format!(
                    "the image data is {found}, not the {declared} it is declared as"
                ));
            }
            None => return Err(format!("the image data is not a valid {declared} image")),
        }
    }
    Ok(())
}

/// Checks base64 image data and its declared media type (Anthropic's `base64` source, Gemini's
/// `inlineData`).
pub(crate) fn check_data(media_type: &str, data: &str) -> Result<(), String> {
    if !media_type.starts_with("image/") {
        return Err(format!("`{media_type}` is not an image media type"));
    }
    check_url(&format!("data:{media_type};base64,{data}"))
}

/// Checks an `http(s)` URL given where no `data:` URL is allowed (Anthropic's `url` source).
pub(crate) fn check_web_url(url: &str) -> Result<(), String> {
    let image = Image::from_url(url).map_err(|e| e.to_string())?;
    match image.source() {
        ImageSource::Url(_) => Ok(()),
        ImageSource::Data(_) => Err("a `url` source takes an http or https URL".into()),
    }
}

/// The sentence the final answer ends with when the task's user turns held images.
pub(crate) fn seen(images: u32) -> String {
    match images {
        0 => String::new(),
        1 => " I see 1 image.".into(),
        n => format!(" I see {n} images."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn images_are_checked_against_their_declared_type() {
        // "\x89PNG\r\n\x1a\n" in base64.
        let png = "iVBORw0KGgo=";
        assert!(check_data("image/png", png).is_ok());
        let err = check_data("image/jpeg", png).unwrap_err();
        assert!(err.contains("image/png"), "{err}");
        assert!(check_data("text/plain", png).is_err());
        assert!(check_data("image/png", "aGVsbG8=").is_err());
        assert!(check_url(&format!("data:image/png;base64,{png}")).is_ok());
        assert!(check_url("https://example.com/a.png").is_ok());
        assert!(check_url("file:///etc/passwd").is_err());
        assert!(check_web_url(&format!("data:image/png;base64,{png}")).is_err());
        assert_eq!(seen(0), "");
        assert_eq!(seen(2), " I see 2 images.");
    }
}
