use clap::Parser;

#[tokio::main]
async fn main() {
    let cli = loadgen::cli::Cli::parse();
    if let Err(e) = loadgen::cli::main(cli).await {
        if let Some(gate) = e.downcast_ref::<loadgen::gate::Gate>() {
            eprintln!("loadgen: {gate}");
            std::process::exit(gate.code);
        }
        eprintln!("loadgen: error: {e:#}");
        std::process::exit(1);
    }
}
