"""infra/check_deps.py finds a dependency nobody names, and accepts the ways code names one."""
import pathlib
import sys
import tempfile
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import check_deps  # noqa: E402


class CheckDepsTest(unittest.TestCase):
    def crate(self, deps: str, code: str) -> list[str]:
        with tempfile.TemporaryDirectory(dir=check_deps.ROOT) as d:
            crate = pathlib.Path(d)
            (crate / "src").mkdir()
            (crate / "Cargo.toml").write_text(f'[package]\nname = "x"\n\n[dependencies]\n{deps}\n')
            (crate / "src" / "lib.rs").write_text(code)
            return [u.split("] ")[1] for u in check_deps.unused_in(crate)]

    def test_finds_the_unused_one(self):
        deps = 'serde-json = "1"\ntokio = "1"\nbytes = "1"\nfutures = "0.3"\nring = "0.17" # used for features'
        code = "use serde_json::Value;\n#[tokio::main]\nasync fn main() {}\nfn f() { futures::join!(); }\n"
        self.assertEqual(self.crate(deps, code), ["bytes"])

    def test_the_layers_keep_their_dependencies(self):
        self.assertEqual([b for c in check_deps.members() for b in check_deps.layering_breaks(c)], [])
        self.assertEqual(set(check_deps.LAYERS), {"crates/domain", "crates/store", "crates/http", "crates/lambda"})
        for layer in check_deps.LAYERS:
            self.assertIn(check_deps.ROOT / layer, check_deps.members(), layer)

    def test_the_workspace_is_clean(self):
        found = [u for c in check_deps.members() for u in check_deps.unused_in(c)]
        self.assertEqual(found, [])


if __name__ == "__main__":
    unittest.main()
