//! A crate's file-level module graph, read from its sources with `syn`:
//! the production code's (`#[cfg(test)]` items are left out: a test may
//! use any module).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fs;
use std::path::Path;

use syn::visit::Visit;

/// A module path inside the crate: `[]` is the crate root, `["run", "plan"]`
/// is `crate::run::plan`.
pub type ModPath = Vec<String>;

/// The modules that have a file of their own, and which of them each one
/// refers to.
#[derive(Debug, Default)]
pub struct CrateGraph {
    pub edges: BTreeMap<ModPath, BTreeSet<ModPath>>,
}

/// One file: its module path and its syntax tree.
struct File {
    module: ModPath,
    ast: syn::File,
}

/// A path met in a file, already made absolute where its first segment says
/// how (`crate`, `self`, `super`, a child module, a name the file imports).
struct Reference {
    path: ModPath,
    /// From a non-private `use` (a re-export), which does not count when it
    /// names a descendant of the module.
    reexport: bool,
}

impl CrateGraph {
    /// Reads every `.rs` file under `src` (binaries' roots and `src/bin`
    /// left out: they are other crates).
    pub fn read(src: &Path) -> Result<CrateGraph, String> {
        let mut files = Vec::new();
        collect(src, src, &mut files)?;
        let modules: BTreeSet<ModPath> = files.iter().map(|f| f.module.clone()).collect();
        let mut aliases = BTreeMap::new();
        for file in &files {
            aliases.insert(file.module.clone(), file_aliases(file, &modules));
        }
        let mut graph = CrateGraph::default();
        for file in &files {
            let mut refs = Refs { file, modules: &modules, stack: Vec::new(), out: Vec::new() };
            refs.visit_file(&file.ast);
            let edges = graph.edges.entry(file.module.clone()).or_default();
            for r in refs.out {
                let Some(target) = resolve(&r.path, &modules, &aliases, 0) else { continue };
                let descendant =
                    target.len() > file.module.len() && target.starts_with(&file.module);
                if target != file.module && !(r.reexport && descendant) {
                    edges.insert(target);
                }
            }
        }
        Ok(graph)
    }
}

fn collect(src: &Path, dir: &Path, out: &mut Vec<File>) -> Result<(), String> {
    let entries = fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry.map_err(|e| e.to_string())?.path();
        let rel = path.strip_prefix(src).map_err(|e| e.to_string())?;
        if path.is_dir() {
            if rel != Path::new("bin") {
                collect(src, &path, out)?;
            }
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") || rel == Path::new("main.rs") {
            continue;
        }
        let text = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let ast = syn::parse_file(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        out.push(File { module: module_of(rel), ast });
    }
    Ok(())
}

/// `lib.rs` -> `[]`, `a/mod.rs` -> `[a]`, `a/b.rs` -> `[a, b]`.
fn module_of(rel: &Path) -> ModPath {
    let mut parts: ModPath =
        rel.with_extension("").iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// The names a file's `use` items bind, each to the absolute path it names.
fn file_aliases(file: &File, modules: &BTreeSet<ModPath>) -> BTreeMap<String, ModPath> {
    let mut refs = Refs { file, modules, stack: Vec::new(), out: Vec::new() };
    let mut aliases = BTreeMap::new();
    for item in &file.ast.items {
        if let syn::Item::Use(u) = item {
            let mut bound = Vec::new();
            flatten(&u.tree, Vec::new(), &mut bound);
            for (path, name) in bound {
                if let (Some(name), Some(abs)) = (name, refs.absolute(&path)) {
                    aliases.insert(name, abs);
                }
            }
        }
    }
    refs.out.clear();
    aliases
}

/// The module file a path lands in: the longest prefix that is a module,
/// through the `use` aliases of that module when the next segment is one.
fn resolve(
    path: &[String],
    modules: &BTreeSet<ModPath>,
    aliases: &BTreeMap<ModPath, BTreeMap<String, ModPath>>,
    depth: usize,
) -> Option<ModPath> {
    let len = (0..=path.len()).rev().find(|&n| modules.contains(&path[..n]))?;
    let module = path[..len].to_vec();
    if let (Some(next), true) = (path.get(len), depth < 16) {
        if let Some(target) = aliases.get(&module).and_then(|a| a.get(next)) {
            if target.as_slice() != &path[..=len] {
                let mut via: ModPath = target.clone();
                via.extend_from_slice(&path[len + 1..]);
                return resolve(&via, modules, aliases, depth + 1);
            }
        }
    }
    Some(module)
}

/// A `use` tree as (path, the name it binds): `a::{b, c as d, e::*}` gives
/// `(a::b, b)`, `(a::c, d)`, `(a::e, None)`.
fn flatten(tree: &syn::UseTree, prefix: Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) {
    let with = |ident: &syn::Ident| {
        let mut p = prefix.clone();
        p.push(ident.to_string());
        p
    };
    match tree {
        syn::UseTree::Path(p) => flatten(&p.tree, with(&p.ident), out),
        syn::UseTree::Name(n) if n.ident == "self" => {
            let name = prefix.last().cloned();
            out.push((prefix, name));
        }
        syn::UseTree::Name(n) => out.push((with(&n.ident), Some(n.ident.to_string()))),
        syn::UseTree::Rename(r) => out.push((with(&r.ident), Some(r.rename.to_string()))),
        syn::UseTree::Glob(_) => out.push((prefix, None)),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                flatten(t, prefix.clone(), out);
            }
        }
    }
}

/// Collects a file's references, tracking inline `mod x { .. }` blocks so
/// that `self` and `super` inside them resolve as the compiler would.
struct Refs<'a> {
    file: &'a File,
    modules: &'a BTreeSet<ModPath>,
    stack: Vec<String>,
    out: Vec<Reference>,
}

impl Refs<'_> {
    fn current(&self) -> ModPath {
        let mut m = self.file.module.clone();
        m.extend(self.stack.iter().cloned());
        m
    }

    /// The absolute path of `segments` as written in the current module, or
    /// `None` for a path into another crate (or a local name).
    fn absolute(&self, segments: &[String]) -> Option<ModPath> {
        let mut base = self.current();
        let mut rest = segments;
        match rest.first().map(String::as_str) {
            Some("crate") => {
                base.clear();
                rest = &rest[1..];
            }
            Some("self") => rest = &rest[1..],
            Some("super") => {
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
            }
            Some(first) => {
                let mut child = self.file.module.clone();
                child.push(first.to_string());
                if !self.modules.contains(&child) {
                    return None;
                }
                base = self.file.module.clone();
            }
            None => return None,
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    fn push(&mut self, segments: &[String], reexport: bool) {
        if let Some(path) = self.absolute(segments) {
            self.out.push(Reference { path, reexport });
        }
    }
}

/// The item's attributes, for the kinds that can carry `#[cfg(test)]`.
fn attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

/// `#[cfg(test)]`: code only the tests build.
fn test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg") && a.parse_args::<syn::Ident>().is_ok_and(|ident| ident == "test")
    })
}

impl<'ast> Visit<'ast> for Refs<'_> {
    /// Test-only code may use any module: the graph is the production one.
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !test_only(attrs(item)) {
            syn::visit::visit_item(self, item);
        }
    }

    /// `pub(in crate::a)` names a module but uses nothing of it.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if m.content.is_some() {
            self.stack.push(m.ident.to_string());
            syn::visit::visit_item_mod(self, m);
            self.stack.pop();
        }
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        let reexport = !matches!(u.vis, syn::Visibility::Inherited);
        let mut bound = Vec::new();
        flatten(&u.tree, Vec::new(), &mut bound);
        for (path, _) in bound {
            self.push(&path, reexport);
        }
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        if segments.len() > 1 {
            self.push(&segments, false);
        }
        syn::visit::visit_path(self, p);
    }
}

/// Every cycle of the graph, one per strongly connected component of more
/// than one module, written as a closed walk (`a -> b -> a`).
pub fn cycles(graph: &CrateGraph) -> Vec<Vec<String>> {
    cycles_with_members(graph).into_iter().map(|(walk, _)| walk).collect()
}

/// [`cycles`], each with every module of its component.
pub fn cycles_with_members(graph: &CrateGraph) -> Vec<(Vec<String>, Vec<String>)> {
    let name = |m: &ModPath| if m.is_empty() { "crate".to_string() } else { m.join("::") };
    let mut found = Vec::new();
    for component in components(graph) {
        if component.len() < 2 {
            continue;
        }
        let start = component.iter().next().expect("non-empty").clone();
        let walk = shortest_cycle(graph, &start, &component);
        found.push((walk.iter().map(name).collect(), component.iter().map(name).collect()));
    }
    found
}

/// Strongly connected components (Kosaraju: order by finish time, then
/// search the reversed graph).
fn components(graph: &CrateGraph) -> Vec<BTreeSet<ModPath>> {
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    for start in graph.edges.keys() {
        finish_order(graph, start, &mut seen, &mut order);
    }
    let mut reversed: BTreeMap<&ModPath, Vec<&ModPath>> = BTreeMap::new();
    for (from, tos) in &graph.edges {
        for to in tos {
            reversed.entry(to).or_default().push(from);
        }
    }
    let mut assigned = BTreeSet::new();
    let mut out = Vec::new();
    for start in order.iter().rev() {
        if !assigned.insert(start.clone()) {
            continue;
        }
        let mut component = BTreeSet::from([start.clone()]);
        let mut todo = vec![start];
        while let Some(m) = todo.pop() {
            for &from in reversed.get(m).into_iter().flatten() {
                if assigned.insert(from.clone()) {
                    component.insert(from.clone());
                    todo.push(from);
                }
            }
        }
        out.push(component);
    }
    out
}

fn finish_order(
    graph: &CrateGraph,
    start: &ModPath,
    seen: &mut BTreeSet<ModPath>,
    order: &mut Vec<ModPath>,
) {
    if !seen.insert(start.clone()) {
        return;
    }
    // Iterative depth-first search: (module, its successors not yet tried).
    let succ = |m: &ModPath| graph.edges.get(m).into_iter().flatten().cloned().collect::<Vec<_>>();
    let mut stack = vec![(start.clone(), succ(start))];
    while let Some((module, next)) = stack.last_mut() {
        if let Some(to) = next.pop() {
            if seen.insert(to.clone()) {
                let s = succ(&to);
                stack.push((to, s));
            }
        } else {
            order.push(module.clone());
            stack.pop();
        }
    }
}

/// The shortest walk from `start` back to itself inside `within`.
fn shortest_cycle(graph: &CrateGraph, start: &ModPath, within: &BTreeSet<ModPath>) -> Vec<ModPath> {
    let mut parent: BTreeMap<ModPath, ModPath> = BTreeMap::new();
    let mut queue = VecDeque::from([start.clone()]);
    while let Some(m) = queue.pop_front() {
        for to in graph.edges.get(&m).into_iter().flatten() {
            if to == start {
                let mut walk = vec![start.clone(), m.clone()];
                let mut at = m.clone();
                while let Some(p) = parent.get(&at) {
                    walk.push(p.clone());
                    at = p.clone();
                }
                walk.reverse();
                walk.rotate_right(1);
                walk.push(start.clone());
                walk.dedup();
                return walk;
            }
            if within.contains(to) && !parent.contains_key(to) && to != start {
                parent.insert(to.clone(), m.clone());
                queue.push_back(to.clone());
            }
        }
    }
    vec![start.clone()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> CrateGraph {
        let dir = tempfile::tempdir().expect("temp dir");
        for (path, text) in files {
            let p = dir.path().join(path);
            fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            fs::write(p, text).expect("write");
        }
        CrateGraph::read(dir.path()).expect("read")
    }

    #[test]
    fn a_two_file_cycle_is_found() {
        let g = tree(&[
            ("lib.rs", "pub mod a; pub mod b;"),
            ("a.rs", "use crate::b::B; pub struct A;"),
            ("b.rs", "pub struct B; fn f() -> crate::a::A { crate::a::A }"),
        ]);
        assert_eq!(cycles(&g), vec![vec!["a", "b", "a"]]);
    }

    #[test]
    fn a_cycle_through_super_and_a_reexport_is_found() {
        let g = tree(&[
            ("lib.rs", "pub mod run; pub use run::engine::Engine;"),
            ("run/mod.rs", "pub mod engine; pub mod plan; pub(crate) const SPIN: u32 = 1;"),
            ("run/engine.rs", "pub struct Engine; fn f() { super::plan::plan(); }"),
            ("run/plan.rs", "pub fn plan() { let _ = crate::Engine; }"),
        ]);
        assert_eq!(cycles(&g), vec![vec!["run::engine", "run::plan", "run::engine"]]);
    }

    #[test]
    fn test_code_and_visibility_paths_make_no_edge() {
        let g = tree(&[
            ("lib.rs", "pub mod low; pub mod high;"),
            ("high.rs", "pub struct High; fn f() { crate::low::g(); }"),
            (
                "low.rs",
                "pub(in crate::high) fn g() {} #[cfg(test)] mod tests { use crate::high::High; }",
            ),
        ]);
        assert!(cycles(&g).is_empty(), "{:?}", g.edges);
    }

    #[test]
    fn reexports_of_children_and_one_way_uses_are_no_cycle() {
        let g = tree(&[
            ("lib.rs", "pub mod run; pub mod sys; pub use run::Engine;"),
            ("run/mod.rs", "mod engine; pub use engine::Engine; use crate::sys::clone;"),
            (
                "run/engine.rs",
                "pub struct Engine; fn f() { crate::sys::clone(); super::super::sys::clone(); }",
            ),
            ("sys/mod.rs", "pub fn clone() {} #[cfg(test)] mod tests { use super::*; }"),
        ]);
        assert!(cycles(&g).is_empty(), "{:?}", g.edges);
        assert!(g.edges[&vec!["run".to_string()]].contains(&vec!["sys".to_string()]));
    }

    #[test]
    fn a_parent_using_a_child_that_uses_it_back_is_a_cycle() {
        let g = tree(&[
            ("lib.rs", "pub mod server;"),
            (
                "server/mod.rs",
                "mod connection; pub struct Shared; fn run() { connection::handle(); }",
            ),
            ("server/connection.rs", "use super::Shared; pub fn handle() {}"),
        ]);
        assert_eq!(cycles(&g), vec![vec!["server", "server::connection", "server"]]);
    }
}
