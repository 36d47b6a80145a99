package store

import (
	"errors"
	"path/filepath"
	"strings"

	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
)

// envLoadOptions are the AWS SDK's load options for the settings getenv holds (Options.Getenv),
// so that a store given an environment does not read the process's: two stores with different
// credentials can live in one process. Nil getenv adds nothing; the SDK reads the process's.
// Half a key pair (one of AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY set, the other unset or
// empty: a Secret's key misnamed, say) is an error naming both: the SDK said "static
// credentials are empty" at the first request, or read other credentials in silence.
func envLoadOptions(getenv func(string) string) ([]func(*config.LoadOptions) error, error) {
	if getenv == nil {
		return nil, nil
	}
	var opts []func(*config.LoadOptions) error
	id, secret := getenv("AWS_ACCESS_KEY_ID"), getenv("AWS_SECRET_ACCESS_KEY")
	switch {
	case id != "" && secret == "":
		return nil, errors.New("AWS_ACCESS_KEY_ID is set and AWS_SECRET_ACCESS_KEY is not set or empty: set both (the key pair of the store's user), or neither to use the shared files or the machine's identity")
	case id == "" && secret != "":
		return nil, errors.New("AWS_SECRET_ACCESS_KEY is set and AWS_ACCESS_KEY_ID is not set or empty: set both (the key pair of the store's user), or neither to use the shared files or the machine's identity")
	case id != "":
		opts = append(opts, config.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider(id, secret, getenv("AWS_SESSION_TOKEN"))))
	}
	if r := firstSet(getenv, "AWS_REGION", "AWS_DEFAULT_REGION"); r != "" {
		opts = append(opts, config.WithRegion(r))
	}
	if p := firstSet(getenv, "AWS_PROFILE", "AWS_DEFAULT_PROFILE"); p != "" {
		opts = append(opts, config.WithSharedConfigProfile(p))
	}
	home := getenv("HOME")
	opts = append(opts,
		config.WithSharedConfigFiles(sharedFile(getenv("AWS_CONFIG_FILE"), home, "config")),
		config.WithSharedCredentialsFiles(sharedFile(getenv("AWS_SHARED_CREDENTIALS_FILE"), home, "credentials")))
	if strings.EqualFold(getenv("AWS_EC2_METADATA_DISABLED"), "true") {
		opts = append(opts, config.WithEC2IMDSClientEnableState(imds.ClientDisabled))
	}
	return opts, nil
}

// sharedFile is the shared config file the environment names, else the one under home/.aws;
// none (an empty list, not the SDK's default) without either.
func sharedFile(named, home, base string) []string {
	switch {
	case named != "":
		return []string{named}
	case home != "":
		return []string{filepath.Join(home, ".aws", base)}
	default:
		return []string{}
	}
}

func firstSet(getenv func(string) string, keys ...string) string {
	for _, k := range keys {
		if v := getenv(k); v != "" {
			return v
		}
	}
	return ""
}
