"""
BLiMP: 67 paradigms x 1000 minimal pairs (sentence_good / sentence_bad), for annex/eval.py. Downloads
data/blimp/<UID>.jsonl from the BLiMP repository. No hashes are published, so each file is checked
by parsing it, and the sha256 of what was received is recorded in meta.json.

    python data/blimp/prepare.py [--force=True]
"""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from data.common import DataError, write_json  # noqa: E402
from data.prepare_tools import cli, download, file_hash, finished  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BASE_URL = "https://raw.githubusercontent.com/alexwarstadt/blimp/master/data/"
UIDS = """
adjunct_island anaphor_gender_agreement anaphor_number_agreement animate_subject_passive
animate_subject_trans causative complex_NP_island coordinate_structure_constraint_complex_left_branch
coordinate_structure_constraint_object_extraction determiner_noun_agreement_1 determiner_noun_agreement_2
determiner_noun_agreement_irregular_1 determiner_noun_agreement_irregular_2
determiner_noun_agreement_with_adj_2
determiner_noun_agreement_with_adj_irregular_1 determiner_noun_agreement_with_adj_irregular_2
determiner_noun_agreement_with_adjective_1 distractor_agreement_relational_noun
distractor_agreement_relative_clause drop_argument ellipsis_n_bar_1 ellipsis_n_bar_2
existential_there_object_raising existential_there_quantifiers_1 existential_there_quantifiers_2
existential_there_subject_raising expletive_it_object_raising inchoative intransitive
irregular_past_participle_adjectives irregular_past_participle_verbs
irregular_plural_subject_verb_agreement_1
irregular_plural_subject_verb_agreement_2 left_branch_island_echo_question
left_branch_island_simple_question
matrix_question_npi_licensor_present npi_present_1 npi_present_2 only_npi_licensor_present only_npi_scope
passive_1 passive_2 principle_A_c_command principle_A_case_1 principle_A_case_2 principle_A_domain_1
principle_A_domain_2 principle_A_domain_3 principle_A_reconstruction
regular_plural_subject_verb_agreement_1
regular_plural_subject_verb_agreement_2 sentential_negation_npi_licensor_present
sentential_negation_npi_scope
sentential_subject_island superlative_quantifiers_1 superlative_quantifiers_2 tough_vs_raising_1
tough_vs_raising_2 transitive wh_island wh_questions_object_gap wh_questions_subject_gap
wh_questions_subject_gap_long_distance wh_vs_that_no_gap wh_vs_that_no_gap_long_distance
wh_vs_that_with_gap
wh_vs_that_with_gap_long_distance
""".split()
# what annex/eval.py reads
FIELDS = ("sentence_good", "sentence_bad", "field", "linguistics_term", "UID")


def prepare(out_dir=HERE, force=False, base_url=BASE_URL, uids=UIDS):
    """Download and check every paradigm into out_dir; returns the meta dict."""
    if (meta := finished(out_dir, force)) is not None:
        return meta
    sha, pairs = {}, 0
    for i, uid in enumerate(uids, 1):
        path = os.path.join(out_dir, f"{uid}.jsonl")
        print(f"[{i}/{len(uids)}] {uid}")
        download([base_url + f"{uid}.jsonl"], path)
        try:
            pairs += len(load_paradigm(path, uid))
        except DataError:
            os.remove(path)  # so that the next run downloads it again
            raise
        sha[uid] = file_hash(path)
    meta = {"paradigms": len(uids), "pairs": pairs, "source": base_url, "sha256": sha}
    write_json(os.path.join(out_dir, "meta.json"), meta)
    print(f"BLiMP: {len(uids)} paradigms, {pairs:,} pairs in {out_dir}")
    return meta


def load_paradigm(path, uid):
    """The pairs (dicts with at least the FIELDS) of paradigm `uid`, read from `path` and checked."""
    if not os.path.exists(path):
        raise DataError(f"{path} not found. Get BLiMP with: python data/blimp/prepare.py")
    pairs = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                pair = json.loads(line)
                ok = isinstance(pair, dict) and all(isinstance(pair.get(k), str) for k in FIELDS)
            except ValueError:
                ok = False
            if not ok or pair["UID"] != uid:
                raise DataError(f"{path} line {lineno} is not a BLiMP pair of paradigm {uid} (a JSON "
                                f"object with string fields {', '.join(FIELDS)}). Delete it and run: "
                                "python data/blimp/prepare.py")
            pairs.append(pair)
    if not pairs:
        raise DataError(f"{path} has no pairs. Delete it and run: python data/blimp/prepare.py")
    return pairs


if __name__ == "__main__":
    cli(prepare, __doc__)
