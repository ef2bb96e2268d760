"""The MLflow model form of a fine-tuned LLM: a pyfunc whose artifact `hf` is a complete HF folder.

Layout inside a logged model: `artifacts/hf/` holds weights, tokenizer, chat template and
`deployment_profile.yaml`. Serving and eval load that folder directly; `predict` exists so the model also
works with `mlflow models predict` and pyfunc tooling.
"""

from __future__ import annotations

from pathlib import Path

import mlflow.pyfunc

HF_ARTIFACT = "hf"


class HFChatModel(mlflow.pyfunc.PythonModel):
    def load_context(self, context) -> None:
        self.model_dir = Path(context.artifacts[HF_ARTIFACT])
        self._model = None

    def predict(self, context, model_input, params=None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from mlops.profile import load_profile

        if self._model is None:
            self._tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir), trust_remote_code=False)
            self._model = AutoModelForCausalLM.from_pretrained(str(self.model_dir), trust_remote_code=False).eval()
        profile = load_profile(self.model_dir)
        prompts = list(model_input["prompt"]) if hasattr(model_input, "columns") else list(model_input)
        outputs = []
        for prompt in prompts:
            messages = [{"role": "system", "content": profile.system_prompt}] if profile.system_prompt else []
            messages.append({"role": "user", "content": str(prompt)})
            ids = self._tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
            )
            with torch.no_grad():
                out = self._model.generate(
                    **ids, max_new_tokens=profile.sampling.max_tokens, do_sample=False,
                    pad_token_id=self._tokenizer.eos_token_id,
                )
            outputs.append(self._tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True))
        return outputs


def hf_folder_in(model_dir: Path) -> Path:
    """The HF folder inside a downloaded MLflow model directory (or the folder itself if it is one)."""
    from mlops.hf_folder import find_hf_folder

    return find_hf_folder(Path(model_dir), depth=0)
