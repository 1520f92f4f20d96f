fn main() {
    println!("engine: not built yet");
}
