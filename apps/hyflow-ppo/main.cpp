// hyflow-ppo: verl's PPO trainer with algorithm.adv_estimator=gae (see docs/trainer.md).
#include <hyflow/trainer/ppo_trainer.hpp>

int main(int argc, char** argv) {
  return hyflow::trainer::run_ppo_app(argc, argv, "hyflow-ppo", {{"algorithm.adv_estimator", "gae"}});
}
