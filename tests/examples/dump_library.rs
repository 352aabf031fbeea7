fn main() {
    let p = ratelimit_core::program::Program::new(ratelimit_core::program::CallKind::Function);
    eprintln!("{}", p.handle);
    print!("{}", p.library());
}
