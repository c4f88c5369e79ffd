// main() of the PPO-family apps: config from defaults, INI and command line, then fit().
#include <hyflow/core/error.hpp>
#include <hyflow/trainer/ppo_config.hpp>
#include <hyflow/trainer/ppo_trainer.hpp>

#include <iostream>

namespace hyflow::trainer {

int run_ppo_app(int argc, char** argv, const std::string& program,
                const std::vector<std::pair<std::string, std::string>>& defaults) {
  Config config(ConfigSchema::ppo);
  try {
    for (const auto& [k, v] : defaults) config.set(k, v);
    const bool help = config.apply_arguments(std::vector<std::string>(argv + 1, argv + argc));
    if (help) {
      std::cout << "usage: " << program << " [--config=file.ini] [--key=value ...]\n\nkeys (with defaults):\n"
                << config.help_text();
      return 0;
    }
    (void)read_ppo_config(config);  // every check before anything is loaded: a config error exits 2
  } catch (const Error& e) {
    std::cerr << program << ": " << e.what() << "\n";
    return 2;
  }
  try {
    PPOTrainer trainer(config);
    trainer.init_workers();
    trainer.fit();
  } catch (const std::exception& e) {
    std::cerr << program << ": " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace hyflow::trainer
