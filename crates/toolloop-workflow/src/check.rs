//! Checking a workflow before anything runs: ids, the order of the steps (unknown steps,
//! cycles), every template against the inputs and the steps it may see, limits, and (with a
//! runner) the tools and models the steps name.

use crate::definition::{Workflow, known};
use crate::template;
use std::collections::BTreeSet;

/// The fields of a step's result that templates read as `steps.ID.FIELD`.
pub const RESULT_FIELDS: [&str; 6] = ["output", "text", "success", "skipped", "error", "metadata"];

/// Names every template may use besides `inputs` and `steps` (the template language's own).
const GLOBALS: [&str; 5] = ["range", "dict", "namespace", "debug", "loop"];

/// The order of a workflow's steps: what each runs after, and what its templates may see.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// The steps each step runs after (indices).
    pub deps: Vec<Vec<usize>>,
    /// The steps each step's templates may read: its dependencies and theirs.
    pub visible: Vec<BTreeSet<usize>>,
}

/// A step id or input name: letters, digits and `_`, not starting with a digit, at most 64.
fn valid_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && s.len() <= 64
}

/// The steps' order, or the problems that prevent one (bad or repeated ids, unknown steps in
/// `depends_on`, cycles).
pub(crate) fn plan(workflow: &Workflow) -> Result<Plan, Vec<String>> {
    let mut problems = Vec::new();
    if workflow.steps.is_empty() {
        problems.push(format!("workflow `{}` has no steps", workflow.name));
    }
    let mut seen = BTreeSet::new();
    for step in &workflow.steps {
        if !valid_name(&step.id) {
            problems.push(format!(
                "step id `{}`: expected letters, digits and `_`, not starting with a digit, at \
                 most 64 characters (templates read it as `steps.ID`)",
                step.id
            ));
        }
        if !seen.insert(step.id.as_str()) {
            problems.push(format!("step id `{}` is used twice", step.id));
        }
    }
    for name in workflow.inputs.keys() {
        if !valid_name(name) {
            problems.push(format!(
                "input `{name}`: expected letters, digits and `_`, not starting with a digit"
            ));
        }
    }
    let index = |id: &str| workflow.steps.iter().position(|s| s.id == id);
    let mut deps = Vec::with_capacity(workflow.steps.len());
    for (i, step) in workflow.steps.iter().enumerate() {
        let mut mine = Vec::new();
        match &step.depends_on {
            None if i > 0 => mine.push(i - 1),
            None => {}
            Some(list) => {
                for id in list {
                    match index(id) {
                        Some(j) if !mine.contains(&j) => mine.push(j),
                        Some(_) => {}
                        None => problems.push(format!(
                            "step `{}`: depends_on names `{id}`, which is not a step ({})",
                            step.id,
                            known(workflow.steps.iter().map(|s| &s.id))
                        )),
                    }
                }
            }
        }
        deps.push(mine);
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    if let Some(cycle) = find_cycle(&deps) {
        let names: Vec<&str> = cycle
            .iter()
            .map(|&i| workflow.steps[i].id.as_str())
            .collect();
        return Err(vec![format!(
            "the steps depend on each other in a cycle: {} (each runs after the next one named)",
            names.join(" → ")
        )]);
    }
    let visible = (0..deps.len())
        .map(|i| {
            let mut out = BTreeSet::new();
            let mut stack = deps[i].clone();
            while let Some(j) = stack.pop() {
                if out.insert(j) {
                    stack.extend(deps[j].iter().copied());
                }
            }
            out
        })
        .collect();
    Ok(Plan { deps, visible })
}

/// A cycle in the graph (a step, what it depends on, …, back to the step), if there is one.
fn find_cycle(deps: &[Vec<usize>]) -> Option<Vec<usize>> {
    // 0 unvisited, 1 on the path, 2 done.
    let mut state = vec![0u8; deps.len()];
    let mut path = Vec::new();
    fn visit(
        i: usize,
        deps: &[Vec<usize>],
        state: &mut [u8],
        path: &mut Vec<usize>,
    ) -> Option<Vec<usize>> {
        state[i] = 1;
        path.push(i);
        for &j in &deps[i] {
            if state[j] == 1 {
                let start = path.iter().position(|&p| p == j).unwrap_or(0);
                let mut cycle = path[start..].to_vec();
                cycle.push(j);
                return Some(cycle);
            }
            if state[j] == 0
                && let Some(c) = visit(j, deps, state, path)
            {
                return Some(c);
            }
        }
        path.pop();
        state[i] = 2;
        None
    }
    (0..deps.len()).find_map(|i| {
        if state[i] == 0 {
            visit(i, deps, &mut state, &mut path)
        } else {
            None
        }
    })
}

/// Everything that can be checked without the runner's tools and models; the plan when all is
/// well.
pub(crate) fn check_definition(workflow: &Workflow) -> Result<Plan, Vec<String>> {
    let plan = plan(workflow)?;
    let mut problems = Vec::new();
    let env = template::environment();
    for (i, step) in workflow.steps.iter().enumerate() {
        let mut templates: Vec<(&str, &str, bool)> = vec![("prompt", step.prompt.as_str(), false)];
        if let Some(system) = step.system(workflow) {
            let field = if step.system.is_some() {
                "system"
            } else {
                "defaults.system"
            };
            templates.push((field, system, false));
        }
        if let Some(when) = &step.when {
            templates.push(("when", when.as_str(), true));
        }
        for (field, source, expression) in templates {
            let vars = if expression {
                template::expression_variables(&env, source)
            } else {
                template::variables(&env, source)
            };
            match vars {
                Err(e) => problems.push(format!("step `{}`: {field}: {e}", step.id)),
                Ok(vars) => {
                    for var in vars {
                        if let Err(e) = check_variable(workflow, &plan, i, &var) {
                            problems.push(format!("step `{}`: {field}: {e}", step.id));
                        }
                    }
                }
            }
        }
        if step.max_rounds(workflow) == 0 {
            problems.push(format!(
                "step `{}`: max_rounds 0: a step needs at least 1 round",
                step.id
            ));
        }
        if let Err(e) = step.timeout(workflow) {
            problems.push(e);
        }
        if let Some(schema) = &step.output_schema
            && let Err(e) = crate::output::check_schema(step, schema)
        {
            problems.push(format!("step `{}`: output_schema: {e}", step.id));
        }
        let mut names = BTreeSet::new();
        for tool in &step.tools {
            if !names.insert(tool) {
                problems.push(format!("step `{}`: tool `{tool}` is listed twice", step.id));
            }
        }
    }
    if let Some(n) = workflow.max_parallel
        && !(1..=64).contains(&n)
    {
        problems.push(format!("max_parallel {n}: expected 1 to 64"));
    }
    if problems.is_empty() {
        Ok(plan)
    } else {
        Err(problems)
    }
}

/// Checks one variable a template of step `i` reads.
fn check_variable(workflow: &Workflow, plan: &Plan, i: usize, var: &str) -> Result<(), String> {
    let parts: Vec<&str> = var.split('.').collect();
    match parts[0] {
        "inputs" => match parts.get(1) {
            None => Ok(()),
            Some(name) if workflow.inputs.contains_key(*name) => Ok(()),
            Some(name) => Err(format!(
                "undefined variable `{var}`: `{name}` is not an input of the workflow ({})",
                known(workflow.inputs.keys())
            )),
        },
        "steps" => {
            let Some(id) = parts.get(1) else {
                return Ok(());
            };
            let visible = &plan.visible[i];
            let Some(j) = workflow.steps.iter().position(|s| s.id == *id) else {
                return Err(format!(
                    "undefined variable `{var}`: `{id}` is not a step ({})",
                    known(workflow.steps.iter().map(|s| &s.id))
                ));
            };
            if !visible.contains(&j) {
                let seen: Vec<&String> = visible.iter().map(|&k| &workflow.steps[k].id).collect();
                return Err(format!(
                    "undefined variable `{var}`: step `{id}` does not come before this one, so \
                     its result is not known when this one runs (add it to depends_on; the \
                     steps this one may read: {})",
                    if seen.is_empty() {
                        "none".to_string()
                    } else {
                        seen.iter()
                            .map(|s| s.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    }
                ));
            }
            let Some(field) = parts.get(2) else {
                return Ok(());
            };
            if !RESULT_FIELDS.contains(field) {
                return Err(format!(
                    "undefined variable `{var}`: a step's result has no `{field}` (it has {})",
                    RESULT_FIELDS.join(", ")
                ));
            }
            if *field != "output" {
                return Ok(());
            }
            let Some(sub) = parts.get(3) else {
                return Ok(());
            };
            let other = &workflow.steps[j];
            let Some(schema) = &other.output_schema else {
                return Err(format!(
                    "undefined variable `{var}`: the output of step `{id}` is text (it has no \
                     output_schema), so it has no field `{sub}`"
                ));
            };
            match schema.get("properties").and_then(|p| p.as_object()) {
                Some(props) if !props.contains_key(*sub) => {
                    let names: Vec<&String> = props.keys().collect();
                    Err(format!(
                        "undefined variable `{var}`: the output_schema of step `{id}` has no \
                         property `{sub}` ({})",
                        known(names.into_iter())
                    ))
                }
                _ => Ok(()),
            }
        }
        name if GLOBALS.contains(&name) => Ok(()),
        _ => Err(format!(
            "undefined variable `{var}`: templates read `inputs.NAME` and `steps.ID.output` \
             (or `.text`, `.success`, `.skipped`, `.error`, `.metadata`)"
        )),
    }
}
