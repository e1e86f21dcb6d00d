/* A stand-in for the `paradev` command's dispatch, so that `paradev admin`
 * (client/cli_admin.c) and the Slurm scripts that call it are tested before
 * and apart from the rest of the CLI: `paradev_admin_cli admin ...`. */
#include <stdio.h>
#include <string.h>

int cli_admin(int argc, char **argv);

int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "admin") == 0)
    return cli_admin(argc - 1, argv + 1);
  fprintf(stderr, "usage: %s admin COMMAND ... (only 'admin' is here)\n",
          argv[0]);
  return 2;
}
