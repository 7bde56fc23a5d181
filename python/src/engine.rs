//! `Engine`: a model loaded onto the server's engine thread, and requests
//! answered by the server's routes in this process.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Method, Request};
use axum::Router;
use hamburger::draft::SpecType;
use hamburger::{DeviceChoice, DraftParams, EngineParams, LoadOptions, StepParams};
use pyo3::exceptions::{PyFileNotFoundError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use server::job::{ModelInfo, RequestDefaults};
use server::{HttpOptions, Scheduler, SchedulerConfig};

use crate::errors;
use crate::stream::{self, Item, Stream};
use crate::wait;

/// Requests that may wait for a sequence: a Python program's threads.
const QUEUE: usize = 64;

/// How long one generation may take: as long as it needs (a notebook
/// interrupts it with KeyboardInterrupt).
const NO_TIMEOUT: Duration = Duration::from_secs(365 * 24 * 3600);

/// A loaded model and the engine thread decoding for it.
#[pyclass(frozen, module = "hamburger._native")]
pub struct Engine {
    rt: tokio::runtime::Runtime,
    app: Mutex<Option<Router>>,
    scheduler: Mutex<Option<Scheduler>>,
    info: Arc<ModelInfo>,
}

/// The KV cache type named by `name` (`f32`, `f16`, `q8_0`).
fn kv_type(name: &str) -> PyResult<ggml::Type> {
    ["f32", "f16", "q8_0"]
        .contains(&name)
        .then(|| ggml::Type::from_name(name))
        .flatten()
        .ok_or_else(|| PyValueError::new_err(format!("type_k '{name}': expected f32, f16 or q8_0")))
}

#[pymethods]
impl Engine {
    /// Loads `model_path` (a HAMburger GGUF, or a llama GGUF as its base
    /// alone) onto an engine of `n_parallel` sequences sharing `n_ctx` KV
    /// cells each (0: the model's training context). `confidence` and
    /// `spec_type` are the defaults of requests that set none (`None`: the
    /// file's recommended confidence, macro steps); `chat_template` (Jinja)
    /// or `chat_format` (a built-in template's name) replaces the model's.
    #[new]
    #[pyo3(signature = (model_path, *, n_ctx, n_batch, n_threads, n_gpu_layers, device, kv_type_name, flash_attn, n_parallel, seed, confidence, spec_type, chat_format, chat_template, verbose))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model_path: PathBuf,
        n_ctx: usize,
        n_batch: usize,
        n_threads: Option<usize>,
        n_gpu_layers: usize,
        device: &str,
        kv_type_name: &str,
        flash_attn: Option<bool>,
        n_parallel: usize,
        seed: Option<u64>,
        confidence: Option<f32>,
        spec_type: Option<&str>,
        chat_format: Option<&str>,
        chat_template: Option<String>,
        verbose: bool,
    ) -> PyResult<Engine> {
        let level = if verbose { log::LevelFilter::Info } else { log::LevelFilter::Warn };
        // The first Llama of a process sets the level; later ones share it.
        let _ = env_logger::Builder::new().filter_level(level).try_init();
        if !model_path.is_file() {
            return Err(PyFileNotFoundError::new_err(format!("model_path: no such file: {}", model_path.display())));
        }
        let kv_type = kv_type(kv_type_name)?;
        if kv_type.is_quantized() && flash_attn == Some(false) {
            return Err(PyValueError::new_err(format!(
                "type_k {kv_type_name} needs flash attention (flash_attn=True)"
            )));
        }
        let per_seq = match n_ctx {
            0 => hamburger::model::context_length_of(&model_path)
                .map_err(|e| errors::LoadError::new_err(e.to_string()))?,
            n => n,
        };
        let n_ctx_total = per_seq
            .checked_mul(n_parallel)
            .ok_or_else(|| PyValueError::new_err(format!("n_ctx {per_seq} x n_parallel {n_parallel} overflows")))?;
        let device: DeviceChoice = device.parse().map_err(|e| match e {
            hamburger::Error::Param(p) => errors::param(&p),
            e => PyValueError::new_err(format!("device: {e}")),
        })?;
        let draft = match spec_type.map(SpecType::parse) {
            None | Some(Ok(SpecType::None)) => None,
            Some(Ok(SpecType::SelfVerified { ngram })) => {
                Some(DraftParams { ngram: ngram.then_some(hamburger::ngram::DEFAULT_SIZE), ..DraftParams::default() })
            }
            Some(Ok(SpecType::DraftModel)) => {
                return Err(PyValueError::new_err(
                    "spec_type draft-simple needs a draft model, which Llama does not load",
                ))
            }
            Some(Err(e)) => return Err(PyValueError::new_err(format!("spec_type: {e}"))),
        };
        let chat_template = match (chat_template, chat_format) {
            (Some(jinja), _) => Some(jinja),
            (None, Some(name)) => Some(hamburger::chat::built_in(name).map(str::to_string).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "chat_format '{name}': expected one of {} (or chat_template, a Jinja template)",
                    hamburger::chat::built_in_names()
                ))
            })?),
            (None, None) => None,
        };
        let recommended = hamburger::model::recommended_confidence_of(&model_path).ok().flatten();
        let step = StepParams {
            confidence: confidence.or(recommended).unwrap_or(StepParams::default().confidence),
            draft,
            ..Default::default()
        };
        let engine = EngineParams {
            n_ctx: n_ctx_total,
            n_seq: n_parallel,
            n_batch,
            n_threads: n_threads.unwrap_or(EngineParams::default().n_threads),
            kv_type,
            flash_attn,
        };
        let cfg = SchedulerConfig {
            model: model_path.clone(),
            load: LoadOptions { device, n_gpu_layers, ..Default::default() },
            engine,
            step,
            queue: QUEUE,
            chat_template,
            no_jinja: false,
            template_isolation: None,
            alias: None,
            n_predict: None,
            defaults: RequestDefaults { seed, n_ctx_seq: Some(per_seq), ..Default::default() },
            draft: None,
        };
        let scheduler = py.detach(|| Scheduler::start(cfg)).map_err(|e| errors::start(&e))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| PyRuntimeError::new_err(format!("cannot start the async runtime: {e}")))?;
        let http = HttpOptions {
            api_key: None,
            timeout: NO_TIMEOUT,
            cors: server::http::Cors::Any,
            slots_endpoint: true,
            metrics_endpoint: true,
            aliases: Vec::new(),
            tags: Vec::new(),
            webui: false,
            model_path: model_path.display().to_string(),
            total_slots: n_parallel,
            vertex: None,
        };
        let app = server::app(&scheduler, http);
        let info = scheduler.info.clone();
        Ok(Engine { rt, app: Mutex::new(Some(app)), scheduler: Mutex::new(Some(scheduler)), info })
    }

    /// Answers `method path` with the JSON `body`: the status and the body.
    #[pyo3(signature = (method, path, body=None))]
    fn request(&self, py: Python<'_>, method: &str, path: &str, body: Option<String>) -> PyResult<(u16, String)> {
        let (mut rx, task) = stream::send(self.rt.handle(), self.app()?, self.build(method, path, body)?, false);
        let answer = (|| {
            let Item::Head(status) = wait::one(py, self.rt.handle(), &mut rx)? else {
                return Err(PyRuntimeError::new_err("an answer without a status"));
            };
            let Item::Data(body) = wait::one(py, self.rt.handle(), &mut rx)? else {
                return Err(PyRuntimeError::new_err("an answer without a body"));
            };
            Ok((status, body))
        })();
        if answer.is_err() {
            task.abort();
        }
        answer
    }

    /// Answers `POST path` with the JSON `body` (`"stream": true`) as a stream of events.
    fn stream(&self, py: Python<'_>, path: &str, body: String) -> PyResult<Stream> {
        let (rx, task) = stream::send(self.rt.handle(), self.app()?, self.build("POST", path, Some(body))?, true);
        Stream::open(py, self.rt.handle().clone(), rx, task)
    }

    /// The token ids of `text`, BOS first when `add_bos` and the model wants it.
    fn tokenize(&self, text: &str, add_bos: bool) -> PyResult<Vec<u32>> {
        self.info.tokenizer.encode(text, add_bos).map_err(|e| PyValueError::new_err(format!("text: {e}")))
    }

    /// The UTF-8 bytes of `tokens`; special tokens' texts only with `special`.
    fn detokenize<'py>(&self, py: Python<'py>, tokens: Vec<u32>, special: bool) -> PyResult<Bound<'py, PyBytes>> {
        let n_vocab = self.info.n_vocab;
        if let Some(bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(PyValueError::new_err(format!("tokens: {bad} is outside the vocabulary of {n_vocab} tokens")));
        }
        let kept: Vec<u32> = if special {
            tokens
        } else {
            let hidden = self.info.tokenizer.special_ids();
            tokens.into_iter().filter(|t| !hidden.contains(t)).collect()
        };
        Ok(PyBytes::new(py, self.info.tokenizer.decode(&kept).as_bytes()))
    }

    /// KV cells one request's context may take (its slot's context, not
    /// the pool's `n_ctx` that `n_parallel` requests share).
    #[getter(n_ctx)]
    fn context_per_request(&self) -> usize {
        self.info.n_ctx_seq
    }

    /// The vocabulary's size.
    #[getter]
    fn n_vocab(&self) -> usize {
        self.info.n_vocab
    }

    /// The most tokens one macro step emits (1: a base model alone).
    #[getter]
    fn max_steps(&self) -> usize {
        self.info.max_steps
    }

    /// The confidence of requests that set none.
    #[getter]
    fn confidence(&self) -> f32 {
        self.info.step.confidence
    }

    /// The model's name, as answers report it.
    #[getter]
    fn name(&self) -> String {
        self.info.name.clone()
    }

    /// The end-of-generation token ids.
    #[getter]
    fn eog(&self) -> Vec<u32> {
        self.info.eog.clone()
    }

    /// Stops the engine thread once its requests end; the engine answers no more.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.app.lock().unwrap_or_else(PoisonError::into_inner).take();
        let scheduler = self.scheduler.lock().unwrap_or_else(PoisonError::into_inner).take();
        match scheduler {
            Some(s) => py.detach(|| s.shutdown()).map_err(PyRuntimeError::new_err),
            None => Ok(()),
        }
    }
}

impl Engine {
    /// The routes, while the engine is open.
    fn app(&self) -> PyResult<Router> {
        let app = self.app.lock().unwrap_or_else(PoisonError::into_inner);
        app.clone().ok_or_else(|| PyRuntimeError::new_err("the model was closed"))
    }

    /// The request `method path` with the JSON `body`.
    fn build(&self, method: &str, path: &str, body: Option<String>) -> PyResult<Request<Body>> {
        let method: Method = method.parse().map_err(|_| PyValueError::new_err(format!("method '{method}'")))?;
        Request::builder()
            .method(method)
            .uri(path)
            .header(header::CONTENT_TYPE, "application/json")
            .body(body.map_or_else(Body::empty, Body::from))
            .map_err(|e| PyValueError::new_err(format!("path '{path}': {e}")))
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.app.get_mut().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(s) = self.scheduler.get_mut().unwrap_or_else(PoisonError::into_inner).take() {
            let _ = s.shutdown();
        }
    }
}
