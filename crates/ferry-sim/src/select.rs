//! Label and node selectors, evaluated as the API machinery defines them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

type Labels = BTreeMap<String, String>;

/// Whether `labels` satisfy a metav1 `LabelSelector` (all of `matchLabels` and
/// `matchExpressions`). An empty selector matches everything.
pub(crate) fn label_selector_matches(selector: &LabelSelector, labels: &Labels) -> bool {
    let labels_ok = selector.match_labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok =
        selector.match_expressions.iter().flatten().all(|r| label_requirement(r, labels));
    labels_ok && exprs_ok
}

fn label_requirement(r: &LabelSelectorRequirement, labels: &Labels) -> bool {
    requirement(&r.key, &r.operator, r.values.as_deref().unwrap_or_default(), labels)
}

fn requirement(key: &str, operator: &str, values: &[String], labels: &Labels) -> bool {
    let value = labels.get(key);
    match operator {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|b| b.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if operator == "Gt" { v > bound } else { v < bound }
        }
        _ => false,
    }
}

/// Whether a node with `labels` (and name `name`, for `matchFields`) satisfies a core
/// `NodeSelector`: any term matches, and a term matches when all its requirements do.
pub(crate) fn node_selector_matches(selector: &NodeSelector, name: &str, labels: &Labels) -> bool {
    selector.node_selector_terms.iter().any(|term| {
        let exprs = term.match_expressions.iter().flatten().all(|r| node_requirement(r, labels));
        let fields = term.match_fields.iter().flatten().all(|r| {
            let fields: Labels = [("metadata.name".to_owned(), name.to_owned())].into();
            node_requirement(r, &fields)
        });
        let empty = term.match_expressions.as_ref().is_none_or(Vec::is_empty)
            && term.match_fields.as_ref().is_none_or(Vec::is_empty);
        !empty && exprs && fields
    })
}

fn node_requirement(r: &NodeSelectorRequirement, labels: &Labels) -> bool {
    requirement(&r.key, &r.operator, r.values.as_deref().unwrap_or_default(), labels)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSelectorTerm;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn match_labels_must_all_match() {
        let sel = LabelSelector {
            match_labels: Some(labels(&[("a", "1"), ("b", "2")])),
            ..LabelSelector::default()
        };
        assert!(label_selector_matches(&sel, &labels(&[("a", "1"), ("b", "2"), ("c", "3")])));
        assert!(!label_selector_matches(&sel, &labels(&[("a", "1")])));
        assert!(!label_selector_matches(&sel, &labels(&[("a", "1"), ("b", "x")])));
        assert!(label_selector_matches(&LabelSelector::default(), &labels(&[])));
    }

    #[test]
    fn node_selector_terms_are_ored() {
        let term = |key: &str, op: &str, vals: &[&str]| NodeSelectorTerm {
            match_expressions: Some(vec![NodeSelectorRequirement {
                key: key.into(),
                operator: op.into(),
                values: Some(vals.iter().map(|v| (*v).to_owned()).collect()),
            }]),
            match_fields: None,
        };
        let sel = NodeSelector {
            node_selector_terms: vec![term("zone", "In", &["x"]), term("host", "In", &["n2"])],
        };
        assert!(node_selector_matches(&sel, "n1", &labels(&[("zone", "x")])));
        assert!(node_selector_matches(&sel, "n2", &labels(&[("host", "n2")])));
        assert!(!node_selector_matches(&sel, "n3", &labels(&[("zone", "y"), ("host", "n3")])));
        let not_in = NodeSelector { node_selector_terms: vec![term("zone", "NotIn", &["x"])] };
        assert!(node_selector_matches(&not_in, "n", &labels(&[])));
        assert!(!node_selector_matches(&not_in, "n", &labels(&[("zone", "x")])));
    }

    fn expr(key: &str, op: &str, vals: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!vals.is_empty()).then(|| vals.iter().map(|v| (*v).to_owned()).collect()),
        }
    }

    fn one_term(exprs: Vec<NodeSelectorRequirement>) -> NodeSelector {
        NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: Some(exprs),
                match_fields: None,
            }],
        }
    }

    #[test]
    fn node_selector_operators() {
        let node = labels(&[("pool", "movers"), ("cores", "16"), ("zone", "b")]);
        let holds =
            |e: NodeSelectorRequirement| node_selector_matches(&one_term(vec![e]), "n", &node);
        assert!(holds(expr("pool", "In", &["x", "movers"])));
        assert!(!holds(expr("pool", "In", &["x"])));
        assert!(!holds(expr("absent", "In", &["x"])));
        assert!(holds(expr("pool", "NotIn", &["x"])));
        assert!(!holds(expr("pool", "NotIn", &["movers"])));
        assert!(holds(expr("absent", "NotIn", &["x"])), "NotIn holds when the label is missing");
        assert!(holds(expr("zone", "Exists", &[])));
        assert!(!holds(expr("absent", "Exists", &[])));
        assert!(holds(expr("absent", "DoesNotExist", &[])));
        assert!(!holds(expr("zone", "DoesNotExist", &[])));
        assert!(holds(expr("cores", "Gt", &["8"])));
        assert!(!holds(expr("cores", "Gt", &["16"])));
        assert!(holds(expr("cores", "Lt", &["17"])));
        assert!(!holds(expr("cores", "Lt", &["16"])));
        assert!(!holds(expr("zone", "Gt", &["1"])), "Gt on a non-number does not hold");
        assert!(!holds(expr("absent", "Lt", &["1"])), "Lt on a missing label does not hold");
        assert!(!holds(expr("pool", "Like", &["movers"])), "unknown operators never hold");
    }

    #[test]
    fn node_selector_expressions_are_anded_and_empty_terms_match_nothing() {
        let node = labels(&[("pool", "movers"), ("zone", "b")]);
        let both = one_term(vec![expr("pool", "In", &["movers"]), expr("zone", "In", &["b"])]);
        assert!(node_selector_matches(&both, "n", &node));
        let one_fails = one_term(vec![expr("pool", "In", &["movers"]), expr("zone", "In", &["a"])]);
        assert!(!node_selector_matches(&one_fails, "n", &node));
        assert!(!node_selector_matches(&one_term(vec![]), "n", &node));
        assert!(!node_selector_matches(&NodeSelector { node_selector_terms: vec![] }, "n", &node));
        let by_name = NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: None,
                match_fields: Some(vec![expr("metadata.name", "In", &["n"])]),
            }],
        };
        assert!(node_selector_matches(&by_name, "n", &node));
        assert!(!node_selector_matches(&by_name, "m", &node));
    }
}
