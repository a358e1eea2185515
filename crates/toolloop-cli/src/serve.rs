//! `toolloop serve --restate ADDR`: a worker that runs the agent the flags describe as a
//! durable service on Restate (see the `toolloop-restate` crate): the Restate server calls it
//! over HTTP/2 for each run, invoked on Restate's ingress.

use crate::run::{AgentArgs, agent_builder_with, tools, usage_error};
use crate::spec::model_from_args;
use clap::Args;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args, Debug)]
pub(crate) struct ServeArgs {
    /// Serve the agent to a Restate server: listen on this address (`127.0.0.1:9080`) for the
    /// server's calls. Several workers may share one address.
    #[arg(long, value_name = "ADDR")]
    pub restate: SocketAddr,
    /// Register this worker with Restate's admin API at this URL (`http://127.0.0.1:9070`).
    #[arg(long, value_name = "URL")]
    pub admin_url: Option<String>,
    /// The URL the Restate server reaches this worker at, when registering (default:
    /// `http://` and the listening address).
    #[arg(long, value_name = "URL", requires = "admin_url")]
    pub advertise: Option<String>,
    #[command(flatten)]
    pub agent: AgentArgs,
}

pub(crate) async fn serve(mut args: ServeArgs) -> ExitCode {
    if let Err(e) = args.agent.prepare() {
        return usage_error(e);
    }
    if let Err(e) = args.agent.check() {
        return usage_error(e);
    }
    if let Err(e) = args.agent.mcp.absolutize() {
        return usage_error(e);
    }
    let tools = match tools(&args.agent).await {
        Ok(t) => t,
        Err(e) => return e.report(),
    };
    let model = match model_from_args(&args.agent.provider) {
        Ok(m) => m,
        Err(e) => return usage_error(e),
    };
    let agent = match agent_builder_with(&args.agent, model, tools)
        .and_then(|b| b.build().map_err(|e| e.to_string()))
    {
        Ok(a) => a,
        Err(e) => return usage_error(e),
    };
    let worker = match toolloop_restate::Worker::bind(args.restate) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("toolloop: --restate: {e}");
            return ExitCode::FAILURE;
        }
    };
    let addr = match worker.local_addr() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("toolloop: --restate {}: {e}", args.restate);
            return ExitCode::FAILURE;
        }
    };
    eprintln!("toolloop: serving the agent to Restate on {addr}");
    let serving = tokio::spawn(worker.serve(agent, async {
        let _ = tokio::signal::ctrl_c().await;
    }));
    if let Some(admin) = &args.admin_url {
        let endpoint = args
            .advertise
            .clone()
            .unwrap_or_else(|| format!("http://{addr}"));
        match toolloop_restate::register(admin, &endpoint, Duration::from_secs(60)).await {
            Ok(()) => eprintln!("toolloop: registered {endpoint} with {admin}"),
            Err(e) => {
                eprintln!("toolloop: --admin-url: {e}");
                serving.abort();
                return ExitCode::FAILURE;
            }
        }
    }
    match serving.await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("toolloop: the worker stopped: {e}");
            ExitCode::FAILURE
        }
    }
}
