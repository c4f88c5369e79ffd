// hyflow-reinforce-pp: verl's PPO trainer with algorithm.adv_estimator=reinforce_plus_plus (see docs/trainer.md).
#include <hyflow/trainer/ppo_trainer.hpp>

int main(int argc, char** argv) {
  return hyflow::trainer::run_ppo_app(argc, argv, "hyflow-reinforce-pp",
                                      {{"algorithm.adv_estimator", "reinforce_plus_plus"}});
}
