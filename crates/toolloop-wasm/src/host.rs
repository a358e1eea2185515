//! The JavaScript side of a run, as the driver calls it.

use js_sys::{Function, Promise, Reflect, Uint8Array};
use wasm_bindgen::{JsCast, JsValue};
use wasm_bindgen_futures::JsFuture;

/// The host object (see the crate's documentation).
pub(crate) struct Host {
    obj: JsValue,
}

/// A reply's head and a way to read its body.
pub(crate) struct Reply {
    pub(crate) status: u16,
    pub(crate) headers: http::HeaderMap,
    read: Function,
    this: JsValue,
}

/// The text of a JavaScript error (its `message`, else the value as JSON). Only through
/// bindings that catch: the value's own formatting (`Debug`, which reads its `name`, `message`
/// and `stack` and calls `toString`) may throw, and what it throws would unwind through the
/// module, leaving the run's promise never settled.
pub(crate) fn describe(e: &JsValue) -> String {
    if let Some(s) = e.as_string() {
        return s;
    }
    Reflect::get(e, &JsValue::from_str("message"))
        .ok()
        .and_then(|m| m.as_string())
        .or_else(|| js_sys::JSON::stringify(e).ok().and_then(|s| s.as_string()))
        .unwrap_or_else(|| "a value that is neither an error with a message nor JSON".into())
}

impl Host {
    pub(crate) fn new(obj: JsValue) -> Self {
        Host { obj }
    }

    fn function(&self, name: &str) -> Result<Function, String> {
        Reflect::get(&self.obj, &JsValue::from_str(name))
            .ok()
            .and_then(|f| f.dyn_into::<Function>().ok())
            .ok_or_else(|| format!("the host has no function `{name}`"))
    }

    /// Whether the host has the function `name`.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.function(name).is_ok()
    }

    /// Calls `name` with `args` and awaits its result when it is a promise.
    async fn call(&self, name: &str, args: &[JsValue]) -> Result<JsValue, String> {
        let f = self.function(name)?;
        let array: js_sys::Array = args.iter().collect();
        let value = f
            .apply(&self.obj, &array)
            .map_err(|e| format!("{name}: {}", describe(&e)))?;
        match value.dyn_into::<Promise>() {
            Ok(p) => JsFuture::from(p)
                .await
                .map_err(|e| format!("{name}: {}", describe(&e))),
            Err(v) => Ok(v),
        }
    }

    /// Calls `name` and takes its answer as text.
    async fn call_text(&self, name: &str, args: &[JsValue]) -> Result<String, String> {
        let v = self.call(name, args).await?;
        v.as_string()
            .ok_or_else(|| format!("{name} gave something other than text"))
    }

    /// Why the run must stop, if it must: the host's `aborted()` answers `"timeout"` when the
    /// run's time limit passed, another true value when the caller cancelled.
    pub(crate) fn interrupted(&self) -> Option<toolloop::engine::Interrupt> {
        use toolloop::engine::Interrupt;
        let v = self
            .function("aborted")
            .ok()
            .and_then(|f| f.call0(&self.obj).ok())?;
        if v.as_string().is_some_and(|s| s == "timeout") {
            Some(Interrupt::Timeout)
        } else {
            v.is_truthy().then_some(Interrupt::Cancelled)
        }
    }

    /// Waits `ms` milliseconds (the host's `sleep`, which ends early when the run is
    /// cancelled); no wait when the host has none.
    pub(crate) async fn sleep(&self, ms: f64) {
        if self.has("sleep") {
            let _ = self.call("sleep", &[JsValue::from_f64(ms)]).await;
        }
    }

    /// Hands an event (JSON text) to the host.
    pub(crate) fn event(&self, json: &str) {
        if let Ok(f) = self.function("event") {
            let _ = f.call1(&self.obj, &JsValue::from_str(json));
        }
    }

    /// A JavaScript model's answer (JSON text) to a request (JSON text).
    pub(crate) async fn complete(&self, request: &str) -> Result<String, String> {
        self.call_text("complete", &[JsValue::from_str(request)])
            .await
    }

    /// Runs attempt `attempt` (1-based) of a tool call, within `timeout_ms` when given; its
    /// answer as JSON text.
    pub(crate) async fn tool(
        &self,
        name: &str,
        args: &str,
        id: &str,
        attempt: u32,
        timeout_ms: Option<f64>,
    ) -> Result<String, String> {
        self.call_text(
            "tool",
            &[
                JsValue::from_str(name),
                JsValue::from_str(args),
                JsValue::from_str(id),
                JsValue::from_f64(f64::from(attempt)),
                timeout_ms.map_or(JsValue::UNDEFINED, JsValue::from_f64),
            ],
        )
        .await
    }

    /// The approval subject a tool gives for a call (`args`: JSON text of its arguments): the
    /// host's `subject(name, args)`, called at once (not awaited), which answers a string.
    pub(crate) fn subject(&self, name: &str, args: &str) -> Result<String, String> {
        let f = self.function("subject")?;
        let v = f
            .call2(
                &self.obj,
                &JsValue::from_str(name),
                &JsValue::from_str(args),
            )
            .map_err(|e| describe(&e))?;
        v.as_string()
            .ok_or_else(|| "it gave something other than a string".into())
    }

    /// A hook's answer (JSON text) to its argument (JSON text).
    pub(crate) async fn hook(&self, name: &str, arg: &str) -> Result<String, String> {
        self.call_text(name, &[JsValue::from_str(arg)]).await
    }

    /// A person's answer (JSON text of a [`toolloop::approval::Answer`]) on a call that waits
    /// for approval (`pending`: JSON text of a [`toolloop::approval::PendingApproval`]).
    pub(crate) async fn approve(&self, pending: &str) -> Result<String, String> {
        self.call_text("approve", &[JsValue::from_str(pending)])
            .await
    }

    /// A `POST` of `body` to `url`.
    pub(crate) async fn post(
        &self,
        url: &str,
        headers: &http::HeaderMap,
        body: &[u8],
    ) -> Result<Reply, String> {
        let h = js_sys::Object::new();
        for (name, value) in headers {
            if let Ok(v) = value.to_str() {
                let _ = Reflect::set(&h, &JsValue::from_str(name.as_str()), &JsValue::from_str(v));
            }
        }
        let body = String::from_utf8_lossy(body);
        let reply = self
            .call(
                "http",
                &[JsValue::from_str(url), h.into(), JsValue::from_str(&body)],
            )
            .await?;
        let get =
            |k: &str| Reflect::get(&reply, &JsValue::from_str(k)).unwrap_or(JsValue::UNDEFINED);
        let status = get("status")
            .as_f64()
            .filter(|s| (100.0..600.0).contains(s))
            .ok_or("http: the reply has no status")? as u16;
        let mut map = http::HeaderMap::new();
        let head = get("headers");
        // Through `Reflect`, whose bindings catch: `Object.entries` runs the object's getters
        // (and a proxy's traps) with no catch, and what one throws would unwind through the
        // module, leaving the run's promise never settled.
        if head.is_object()
            && let Ok(keys) = Reflect::own_keys(&head)
        {
            for key in keys.iter() {
                let (Some(k), Some(v)) = (
                    key.as_string(),
                    Reflect::get(&head, &key).ok().and_then(|v| v.as_string()),
                ) else {
                    continue;
                };
                if let (Ok(k), Ok(v)) = (
                    http::HeaderName::from_bytes(k.as_bytes()),
                    http::HeaderValue::from_str(&v),
                ) {
                    map.append(k, v);
                }
            }
        }
        let read = get("read")
            .dyn_into::<Function>()
            .map_err(|_| "http: the reply has no read()".to_string())?;
        Ok(Reply {
            status,
            headers: map,
            read,
            this: reply,
        })
    }
}

impl Reply {
    /// The body's next chunk, or `None` at its end.
    pub(crate) async fn next(&self) -> Result<Option<Vec<u8>>, String> {
        let v = self
            .read
            .call0(&self.this)
            .map_err(|e| format!("reading the reply: {}", describe(&e)))?;
        let v = match v.dyn_into::<Promise>() {
            Ok(p) => JsFuture::from(p)
                .await
                .map_err(|e| format!("reading the reply: {}", describe(&e)))?,
            Err(v) => v,
        };
        if v.is_undefined() || v.is_null() {
            return Ok(None);
        }
        match v.dyn_into::<Uint8Array>() {
            Ok(a) => Ok(Some(a.to_vec())),
            Err(v) => v
                .as_string()
                .map(|s| Some(s.into_bytes()))
                .ok_or_else(|| "reading the reply: a chunk is neither bytes nor text".into()),
        }
    }

    /// The whole body, at most `limit` bytes.
    pub(crate) async fn body(&self, limit: usize) -> Result<Vec<u8>, String> {
        let mut all = Vec::new();
        while let Some(chunk) = self.next().await? {
            if all.len() + chunk.len() > limit {
                return Err(format!("the reply is larger than {limit} bytes"));
            }
            all.extend_from_slice(&chunk);
        }
        Ok(all)
    }
}

/// Milliseconds since the epoch, from JavaScript's clock.
pub(crate) fn now_ms() -> f64 {
    js_sys::Date::now()
}
