fn main() {
    println!("coremq: see README");
}
