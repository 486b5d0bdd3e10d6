"""A reward function as a TRL GRPO script has it, used as it is by examples/trl.yaml and examples/hf.yaml."""


def contains_answer(prompts, completions, answer, **kwargs):
    """TRL's signature on a conversational dataset: each completion is a list of messages (one assistant
    message here); `answer` is the dataset's column. Pays the answer anywhere in the reply, a lenient
    grader beside the strict built-in `correct`."""
    return [1.0 if a in c[0]["content"] else 0.0 for c, a in zip(completions, answer)]
