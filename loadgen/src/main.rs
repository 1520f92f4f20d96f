fn main() {
    println!("loadgen: not built yet");
}
