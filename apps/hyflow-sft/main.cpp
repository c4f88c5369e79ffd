// hyflow-sft: supervised fine-tuning; without model.partial_pretrain it creates and trains
// the built-in tiny char-level model (see docs/trainer.md).
#include <hyflow/trainer/sft_trainer.hpp>

int main(int argc, char** argv) { return hyflow::trainer::run_sft_app(argc, argv); }
