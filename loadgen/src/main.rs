use clap::Parser;

#[tokio::main]
async fn main() {
    let cli = loadgen::cli::Cli::parse();
    if let Err(e) = loadgen::cli::main(cli).await {
        eprintln!("loadgen: error: {e:#}");
        std::process::exit(1);
    }
}
