pub fn run(_a: crate::cli::DemoArgs) -> anyhow::Result<()> {
    anyhow::bail!("todo")
}
