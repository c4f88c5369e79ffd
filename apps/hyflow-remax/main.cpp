// hyflow-remax: verl's PPO trainer with algorithm.adv_estimator=remax (see docs/trainer.md).
#include <hyflow/trainer/ppo_trainer.hpp>

int main(int argc, char** argv) {
  return hyflow::trainer::run_ppo_app(argc, argv, "hyflow-remax", {{"algorithm.adv_estimator", "remax"}});
}
